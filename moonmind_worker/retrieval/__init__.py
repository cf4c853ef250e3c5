"""Read side: the one pipeline every entry point calls, ranking, the overlay merge plan, budgets, the context pack, evaluation."""
