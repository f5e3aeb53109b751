"""The version, defined once: the package, the wheel's metadata (pyproject.toml) and CITATION.cff read it."""

__version__ = "0.1.0"
