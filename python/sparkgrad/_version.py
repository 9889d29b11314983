"""The one place the version lives: pyproject.toml, setup.py and the C core read it."""

__version__ = "0.1.0"
"""The installed sparkgrad's version (PEP 440), e.g. ``"0.1.0"``.

``sparkgrad.build_info()`` reports it with the versions of the native libraries.
"""
