"""Decoded copies of samples on node-local storage: read once, decoded once (``staging.decoded``)."""

from .budget import decoded_budget, tier_choice
from .records import CorruptRecord, pack, unpack
from .tier import DIR, MODES, DecodedTier, create, create_shared, shared_note

__all__ = ["CorruptRecord", "DIR", "DecodedTier", "MODES", "create", "create_shared", "decoded_budget", "pack",
           "shared_note", "tier_choice", "unpack"]
