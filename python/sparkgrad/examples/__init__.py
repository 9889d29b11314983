"""Runnable examples: ``python -m sparkgrad.examples.<name>``."""
