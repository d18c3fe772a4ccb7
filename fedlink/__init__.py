"""fedlink: federated learning that keeps training when the network is bad."""
from fedlink._version import __version__

__all__ = ["__version__"]
