"""The job lifecycle hook (sets job.capabilities.rag, runs doctor checks, emits queue events)."""
