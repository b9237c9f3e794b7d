"""The scheduled monthly invoice run, on the job queue."""
