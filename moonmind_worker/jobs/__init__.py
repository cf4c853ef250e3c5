"""The job lifecycle: the hook that sets `job.capabilities.rag` at job start and cleans up at the end, and `worker doctor`'s checks."""
