"""Replay semantics shared by every cache-level driver (single cache, tiers, blend).

``TOUCH_ORDERS``: after a request's hits are counted, its blocks are touched or inserted
either head most recent (``"head_most_recent"``: the tail is evicted first, as vLLM's
reverse free does) or tail most recent (``"tail_most_recent"``: the order an object cache
such as libCacheSim sees the blocks). ``HIT_SEMANTICS``: ``"prefix"`` counts the longest
run of leading cached blocks (chained keys); ``"independent"`` looks every block up on its
own. ``SINGLE_TIER`` names the one tier of a single-cache replay in a timeline.
"""

TOUCH_ORDERS = ("head_most_recent", "tail_most_recent")
HIT_SEMANTICS = ("prefix", "independent")

#: Tier name used in the timeline of a single-cache replay.
SINGLE_TIER = "cache"
