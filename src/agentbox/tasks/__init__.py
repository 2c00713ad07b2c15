"""Batch tasks: a persistent queue, workers running a reference agent loop."""
