"""The tools: ``python -m lightning_resumable inspect`` and ``compare``."""
