"""Decoded copies of samples on node-local storage: read once, decoded once (``staging.decoded``)."""

from .budget import decoded_budget, tier_choice
from .records import CorruptRecord, pack, unpack
from .tier import DIR, MODES, DecodedTier, create

__all__ = ["CorruptRecord", "DIR", "DecodedTier", "MODES", "create", "decoded_budget", "pack", "tier_choice", "unpack"]
