"""The reproduction's version: always the library's it was released with (tests/test_packaging.py holds
the two equal, and repro/pyproject.toml pins the library to it)."""

__version__ = "0.1.0"
