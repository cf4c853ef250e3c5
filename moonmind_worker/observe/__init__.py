"""Observability for every embed, search, index and overlay action, in one place.

Each action is wrapped once, at its shared function (`pipeline.retrieve_context_pack`,
the embedders, `indexer.index_repository`, the overlay helpers), so every entry
point — CLI, Celery task, gateway — reports the same way without code of its own:

* StatsD timers/counters (`metrics.py`; names and units in docs/operations.md "Metrics"),
* queue events (`events.publish`; each carries job_id, run_id, repo, tenant),
* for a finished search: a breadcrumb line with the `context_pack_id` and sources,
  and the pack JSON cached under the run's artifacts directory ("Context used").

Nothing here may fail or slow an action: every sink swallows its own errors, and
a failure's event is sent before the error propagates (so a command that exits
non-zero has already reported why).
"""

from .artifacts import ADHOC_RUN, list_packs, no_artifacts, packs_dir, prune_artifacts, record_pack, run_dir_name
from .hooks import budget_exceeded, embed, index, overlay_clean, overlay_upsert, publish, search, search_completed, search_failed

__all__ = [
    "ADHOC_RUN", "budget_exceeded", "embed", "index", "list_packs", "no_artifacts", "overlay_clean", "overlay_upsert",
    "packs_dir", "prune_artifacts", "publish", "record_pack", "run_dir_name", "search", "search_completed", "search_failed",
]
