"""CacheBlend-style non-prefix chunk matching (docs/specs/index_blend.md Part D)."""

from kvlab.blend.kernels import BLEND_BASE, EMPTY, chunk_hashes, rolling_hashes, unique_hits, write_table

__all__ = ["BLEND_BASE", "EMPTY", "chunk_hashes", "rolling_hashes", "unique_hits", "write_table"]
