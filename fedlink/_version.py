"""The installed fedlink version."""

__version__ = "0.2.0"
