"""The package version, in one place (the command line, client items and the wheel read it)."""

__version__ = "0.1.0"
