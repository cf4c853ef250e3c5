"""Write side: canonical index runs, workspace overlay writes, embedding-model sync, and what an index holds (stats)."""
