"""Shared fixtures. Spark fixtures start real local Spark (no mocks)."""
