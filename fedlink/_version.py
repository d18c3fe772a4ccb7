"""The installed fedlink version."""

__version__ = "0.1.0"
