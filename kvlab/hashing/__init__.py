"""Block hashing: tokens → chained block keys, one profile per engine.

(The profile table and factories are filled in as the profiles land.)
"""

from kvlab.hashing.base import (
    NO_EXTRAS,
    BlockHash,
    BlockHasher,
    MMItem,
    RequestExtras,
    coarse_view,
    normalize_engine_hash,
)

__all__ = ["NO_EXTRAS", "BlockHash", "BlockHasher", "MMItem", "RequestExtras", "coarse_view",
           "normalize_engine_hash"]
