"""Text in: which files count, how they are chunked (syntax trees where a grammar exists), their BM25 terms, and safe printing."""
