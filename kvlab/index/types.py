"""Value types of the cluster-global KV block index: pod entries, key kinds, tiers.

Models llm-d ``pkg/kvcache/kvblock/index.go`` (docs/specs/index_blend.md §A.1, rules L1-L3):
a *request key* is the indexer's own chained u64 hash of a block of tokens, an *engine
key* the hash an engine publishes in its KV events; a :class:`PodEntry` says that one
pod holds a block in one tier, and two entries are equal only when the whole tuple
(pod, tier, speculative, group) is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.core.validate import check_flag, check_int, check_str, check_u64
from kvlab.hashing.base import U64_MASK

#: ``key_type`` of :meth:`kvlab.index.Index.evict`: an engine key (from a KV event) or a request key.
ENGINE_KEY, REQUEST_KEY = "engine", "request"
KEY_TYPES = (ENGINE_KEY, REQUEST_KEY)

#: Tier names an index accepts by default: vLLM's and SGLang's event media lower-cased
#: (``GPU``, ``CPU``, ``CPU_PINNED``, ``DISK``, ``STORAGE``, ``EXTERNAL``; docs/specs/hashing.md
#: §1.7, §5) and the tiers of :mod:`kvlab.tiers` presets (``nvme``, ``remote``).
KNOWN_TIERS = ("gpu", "cpu", "cpu_pinned", "disk", "storage", "external", "nvme", "remote")
#: The tier of an event without a ``medium`` (llm-d rule L17).
DEFAULT_TIER = "gpu"


def tier_of_medium(medium: str | None) -> str:
    """The index tier of an event's ``medium``: lower-cased, ``None`` → ``"gpu"`` (rule L17).

    Raises:
        ValueError: ``medium`` is not ``None`` or a non-empty string.

    Example:
        >>> tier_of_medium("CPU_PINNED"), tier_of_medium(None)
        ('cpu_pinned', 'gpu')
    """
    if check_str("medium", medium, nonempty=True, optional=True) is None:
        return DEFAULT_TIER
    return medium.lower()


@dataclass(frozen=True, order=True)
class PodEntry:
    """One pod holding a block in one tier: the value an index keeps per request key.

    Models llm-d ``PodEntry`` (rule L2): equality and hashing are over the whole tuple,
    so ``pod-a@gpu``, ``pod-a@cpu``, ``pod-a@gpu[speculative]`` and ``pod-a@gpu[group=1]``
    are four entries under one key.

    Attributes:
        pod: the pod (worker) identifier, a non-empty string.
        tier: the device tier, lower-cased on construction (``"GPU"`` → ``"gpu"``).
        speculative: added by a router right after a routing decision, before the
            pod's own events confirm it (rule L16).
        group: the KV-cache group index, in ``[0, 2**64)`` as an event's ``group_idx``,
            or ``None`` for an entry without one (llm-d ``HasGroup=false``).

    Raises:
        ValueError: naming the field and value: an empty or non-string pod or tier, a
            non-bool ``speculative``, a group that is not an integer in ``[0, 2**64)``.

    Example:
        >>> a = PodEntry("pod-a", "GPU")
        >>> a, a == PodEntry("pod-a"), a == PodEntry("pod-a", group=0)
        (PodEntry(pod='pod-a', tier='gpu', speculative=False, group=None), True, False)
        >>> a.to_json()
        '{"PodIdentifier":"pod-a","DeviceTier":"gpu","Speculative":false,"HasGroup":false,"GroupIdx":0}'
        >>> PodEntry.from_json(a.to_json()) == a
        True
    """

    pod: str
    tier: str = DEFAULT_TIER
    speculative: bool = False
    group: int | None = None

    def __post_init__(self) -> None:
        check_str("PodEntry.pod", self.pod, nonempty=True)
        object.__setattr__(self, "tier", check_str("PodEntry.tier", self.tier, nonempty=True).lower())
        object.__setattr__(self, "speculative", check_flag("PodEntry.speculative", self.speculative))
        object.__setattr__(self, "group", check_int("PodEntry.group", self.group, low=0, high=U64_MASK, optional=True))

    def to_json(self) -> str:
        """The entry as llm-d's Redis backend writes a hash field (Go ``json.Marshal`` of
        ``PodEntry``: default field names, declaration order, no spaces; rule L13)."""
        return json.dumps({"PodIdentifier": self.pod, "DeviceTier": self.tier, "Speculative": self.speculative,
                           "HasGroup": self.group is not None, "GroupIdx": 0 if self.group is None else self.group},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> PodEntry:
        """The entry of a Redis hash field written by :meth:`to_json` (or by llm-d).

        Raises:
            ValueError: not JSON, or a field missing or of the wrong type (the message
                quotes the text).
        """
        try:
            obj = json.loads(text)
            return cls(obj["PodIdentifier"], obj["DeviceTier"], obj.get("Speculative", False),
                       obj["GroupIdx"] if obj.get("HasGroup", False) else None)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"not a PodEntry JSON field: {text!r} ({type(err).__name__}: {err})") from None


def check_keys(name: str, keys: object, *, allow_empty: bool = False) -> list[int]:
    """A sequence of u64 keys as a list of ints, checked (key 0 is reserved, rule L1).

    Raises:
        ValueError: not a sequence, empty (unless ``allow_empty``), or an item that is
            not an integer in ``[1, 2**64)``; the message names ``name[i]`` and the value.
    """
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a sequence of u64 keys, got {keys!r}")
    out = keys.tolist() if isinstance(keys, np.ndarray) and keys.ndim == 1 and keys.dtype.kind in "iu" else list(keys)
    if out and set(map(type, out)) == {int} and min(out) >= 1 and max(out) <= U64_MASK:
        return out  # the common case, checked in C; the loop below names a bad item
    out = [check_u64(f"{name}[{i}]", key) for i, key in enumerate(keys)]
    if not out and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    for i, key in enumerate(out):
        if key == 0:
            raise ValueError(f"{name}[{i}] is 0, the reserved empty block key (llm-d EmptyBlockHash)")
    return out


def check_entries(entries: object, tiers: Iterable[str] | None) -> list[PodEntry]:
    """A non-empty sequence of :class:`PodEntry`, each tier among ``tiers`` (``None``: any).

    Raises:
        ValueError: not a sequence, empty, an item that is not a ``PodEntry``, or an
            entry whose tier is not known (the message lists the known tiers).
    """
    if isinstance(entries, (str, bytes, PodEntry)) or not isinstance(entries, Sequence):
        raise ValueError(f"entries must be a sequence of PodEntry, got {entries!r}")
    if not entries:
        raise ValueError("entries must not be empty")
    allowed = None if tiers is None else set(tiers)
    for i, entry in enumerate(entries):
        if not isinstance(entry, PodEntry):
            raise ValueError(f"entries[{i}] must be a PodEntry, got {type(entry).__name__} {entry!r}")
        if allowed is not None and entry.tier not in allowed:
            raise ValueError(f"entries[{i}] has unknown tier {entry.tier!r}; this index knows "
                             f"{sorted(allowed)} (pass tiers=... to the index to add one)")
    return list(dict.fromkeys(entries))
