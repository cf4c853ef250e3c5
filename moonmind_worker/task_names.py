"""The Celery task names: the queue's wire contract between its clients (`transports/queue_client.py`) and the workers.

Why a module of its own: the job's scope ceiling (`job_scope.py`) confines a task's arguments by its
name, and importing the names from the transports made that policy depend on the layer above it.
"""

SEARCH = "moonmind.rag.search"
INDEX = "moonmind.rag.index"
OVERLAY_UPSERT = "moonmind.rag.overlay_upsert"
OVERLAY_CLEAN = "moonmind.rag.overlay_clean"
SWEEP = "moonmind.rag.sweep_expired_overlays"
