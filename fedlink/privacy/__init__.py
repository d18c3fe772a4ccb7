"""Update privacy stages (clipping and noise), registered by name in ``PRIVACY_STAGES``."""

from fedlink.privacy.base import PRIVACY_STAGES, NoPrivacy, UpdatePrivacy

__all__ = ["PRIVACY_STAGES", "NoPrivacy", "UpdatePrivacy"]
