"""The one place the version lives: pyproject.toml, setup.py and the C core read it."""

__version__ = "0.1.0"
