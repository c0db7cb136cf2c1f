"""The Redis backend of :class:`~kvlab.index.Index`: llm-d's key layout on a real Redis server.

Models llm-d ``pkg/kvcache/kvblock/redis.go`` (docs/specs/index_blend.md rule L13) through
the ``redis`` client:

* request key ``r`` → a HASH named ``<namespace><decimal r>``; one field per
  :class:`~kvlab.index.PodEntry`, named by :meth:`PodEntry.to_json` (Go's ``json.Marshal``
  of llm-d's ``PodEntry``), value ``""``;
* engine key ``e`` → a SORTED SET named ``<namespace>engine:<decimal e>``; members are the
  decimal request keys, score = the position of the rule-L5 mapping loop. Re-adding an
  engine key unions its members (Part E choice 3);
* emptiness is pruned atomically by two Lua scripts: a request-key hash is deleted when
  ``HLEN == 0``; an engine set only when every request-key hash it lists is empty (rule L7).

Lookup is one pipelined ``HKEYS`` per key (undecodable fields skipped; the sorted entries of
a field list are cached); add and evict are one ``MULTI``/``EXEC`` pipeline each; clear scans
``<namespace>*`` in batches of 1024 keys.
:class:`~kvlab.index.local_redis.LocalRedisServer` starts a throw-away ``redis-server`` on a free
loopback port for notebooks, tests and benchmarks.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Iterator

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvlab.core.validate import check_real, check_str
from kvlab.index.base import Index, entry_sort_key
from kvlab.index.types import ENGINE_KEY, KNOWN_TIERS, PodEntry

#: The address llm-d's Redis backend uses when none is configured (rule L13).
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
#: The client's handshake: RESP2 and no ``CLIENT SETINFO`` (redis-py 8.2 otherwise opens with
#: ``HELLO 3`` and two ``CLIENT SETINFO`` before the first command, and falls back with a warning
#: on a RESP2 server), so a connection's first command is kvlab's own.
_CLIENT_OPTIONS: dict[str, object] = {"protocol": 2, "driver_info": None}  # redis-py >= 8.1
if importlib.util.find_spec("redis.driver_info") is None:  # older: the same through lib_name / lib_version
    _CLIENT_OPTIONS = {"protocol": 2, "lib_name": None, "lib_version": None}

#: Seconds :class:`RedisIndex` waits for a server to accept its connection and answer ``PING``.
DEFAULT_CONNECT_TIMEOUT_S = 2.0
#: Keys asked per ``SCAN`` call by :meth:`RedisIndex.clear` (llm-d's batch).
SCAN_BATCH_KEYS = 1024
_SCHEMES = {"redis": "redis", "rediss": "rediss", "unix": "unix", "valkey": "redis", "valkeys": "rediss"}
#: The URL schemes :func:`redis_url` takes (besides a plain ``host:port``).
REDIS_URL_SCHEMES = tuple(f"{scheme}://" for scheme in _SCHEMES)
_DECODED_CACHE_SIZE = 4096  # hash fields decoded, at most
_SORTED_CACHE_SIZE = 1024  # field lists with their sorted entries, at most

# KEYS = request-key hashes: delete each one left without fields.
_PRUNE_REQUEST_KEYS_LUA = """
local pruned = 0
for _, key in ipairs(KEYS) do
  if redis.call('HLEN', key) == 0 then pruned = pruned + redis.call('DEL', key) end
end
return pruned
"""
# KEYS[1] = an engine sorted set, KEYS[2..] = its request-key hashes: delete the set only if all are empty.
_PRUNE_ENGINE_KEY_LUA = """
for i = 2, #KEYS do
  if redis.call('HLEN', KEYS[i]) > 0 then return 0 end
end
return redis.call('DEL', KEYS[1])
"""


def redis_url(address: str) -> str:
    """A Redis address as a ``redis``-client URL, as llm-d normalises it (rule L13).

    A plain ``host:port`` gets ``redis://``; ``valkey://`` becomes ``redis://`` and
    ``valkeys://`` becomes ``rediss://`` (Valkey speaks the Redis protocol); ``redis://``,
    ``rediss://`` and ``unix://`` URLs pass unchanged.

    Raises:
        ValueError: ``address`` is not a non-empty string, has another scheme, or no host.

    Example:
        >>> redis_url("10.0.0.5:6379"), redis_url("valkeys://cache:6380/0")
        ('redis://10.0.0.5:6379', 'rediss://cache:6380/0')
    """
    if not check_str("url", address).strip():
        raise ValueError(f"url must not be blank, got {address!r}")
    address = address.strip()
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "redis", address
    if scheme.lower() not in _SCHEMES:
        raise ValueError(f"url {address!r} has scheme {scheme!r}; expected host:port or one of "
                         f"{sorted(s + '://' for s in _SCHEMES)}")
    if not rest or (rest.startswith("/") and scheme.lower() != "unix"):
        raise ValueError(f"url {address!r} names no host")
    return f"{_SCHEMES[scheme.lower()]}://{rest}"


def _unreachable(url: str, err: BaseException, timeout_s: float) -> str:
    """The message of a failed construction ``PING`` at ``url``: refused, timed out, not Redis."""
    if isinstance(err, redis.exceptions.TimeoutError):
        why = (f"nothing answered PING within {timeout_s:g} s; something there accepts connections "
               "but does not reply as Redis (raise connect_timeout_s for a slow server)")
    elif isinstance(err, redis.exceptions.InvalidResponse):
        why = "what answers there does not speak the Redis protocol"
    elif isinstance(err, redis.exceptions.ResponseError):
        why = "the server refused PING"
    else:
        why = "the connection failed"
    return (f"cannot reach a Redis server at {url}: {why} ({type(err).__name__}: {err}); start one (e.g. "
            "`redis-server --port 6379`, or kvlab.index.LocalRedisServer()) or pass another url")


class RedisIndex(Index):
    """A cluster-global KV block index kept in Redis with llm-d's layout (rule L13).

    Several indexes share one Redis server on distinct ``namespace`` prefixes. The
    contract (validation, lookup stop rule, speculative TTLs on a logical clock) is
    :class:`~kvlab.index.Index`'s; speculative expiry times live in this process.

    Args:
        url: a Redis address (see :func:`redis_url`; default ``redis://127.0.0.1:6379``)
            or a connected ``redis.Redis`` client (not closed by :meth:`close`).
        namespace: a prefix for every key this index writes, e.g. ``"kvlab:"``; it must
            not end with a digit (``"a1"`` + ``"23"`` would read as ``"a"`` + ``"123"``).
        tiers: the tier names entries may carry (default ``KNOWN_TIERS``).
        connect_timeout_s: seconds to wait for the server to accept the connection, and
            for its answer to the ``PING`` made here (default
            :data:`DEFAULT_CONNECT_TIMEOUT_S`); later commands wait without limit. A
            client passed in is pinged with its own timeouts.

    Attributes:
        client: the ``redis.Redis`` client (bytes responses), for raw inspection.
        url: the normalised URL, or the client's description when one was given.
        namespace: the key prefix.

    Raises:
        ValueError: a bad ``url`` (see :func:`redis_url`), ``namespace``, ``tiers`` or
            ``connect_timeout_s``.
        ConnectionError: (the built-in) any failure to talk Redis with ``url`` at the
            ``PING``: connection refused, no answer within ``connect_timeout_s``, an answer
            that is not Redis protocol (e.g. an HTTP server), a refused ``PING`` (e.g.
            authentication required). The message names the URL and the cause.

    Example (a throw-away server; ``redis-server`` must be installed):
        >>> from kvlab.index.local_redis import LocalRedisServer
        >>> with LocalRedisServer() as server, RedisIndex(server.url, namespace="doc:") as index:
        ...     index.add([100], [1000, 2000], [PodEntry("pod-a")])
        ...     print(sorted(index.client.keys("doc:*")), index.client.zrange("doc:engine:100", 0, -1, withscores=True))
        ...     print(index.lookup([1000, 2000, 3000])[2000], index.get_request_key(100))
        [b'doc:1000', b'doc:2000', b'doc:engine:100'] [(b'1000', 0.0), (b'2000', 1.0)]
        (PodEntry(pod='pod-a', tier='gpu', speculative=False, group=None),) 2000
    """

    def __init__(self, url: str | redis.Redis = DEFAULT_REDIS_URL, *, namespace: str = "",
                 tiers: Iterable[str] = KNOWN_TIERS, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        super().__init__(tiers=tiers)
        if check_str("namespace", namespace)[-1:].isdigit():  # a digit would run into the request key
            raise ValueError(f"namespace must not end with a digit, got {namespace!r}")
        connect_timeout_s = check_real("connect_timeout_s", connect_timeout_s, low=0.0, low_open=True)
        if isinstance(url, redis.Redis):
            self.client, self.url, self._owns_client = url, repr(url), False
            probe = url
        else:
            self.url = redis_url(url)
            try:
                self.client = redis.Redis.from_url(self.url, socket_connect_timeout=connect_timeout_s,
                                                   **_CLIENT_OPTIONS)
                probe = redis.Redis.from_url(self.url, socket_connect_timeout=connect_timeout_s, **_CLIENT_OPTIONS,
                                             socket_timeout=connect_timeout_s, retry=Retry(NoBackoff(), 0))
            except ValueError as err:  # e.g. a port that is not a number
                raise ValueError(f"url {self.url!r}: {err}") from None
            self._owns_client = True
        try:
            probe.ping()
        except redis.exceptions.RedisError as err:
            self.close()
            raise ConnectionError(_unreachable(self.url, err, connect_timeout_s)) from None
        finally:
            if probe is not url:
                probe.close()
        self.namespace = namespace
        self._prefix = namespace.encode()
        self._engine_prefix = (namespace + "engine:").encode()
        self._prune_request_keys = self.client.register_script(_PRUNE_REQUEST_KEYS_LUA)
        self._prune_engine_key = self.client.register_script(_PRUNE_ENGINE_KEY_LUA)
        self._decoded: dict[bytes, tuple[tuple, PodEntry] | None] = {}  # field -> (sort key, entry)
        self._sorted: dict[tuple[bytes, ...], tuple[PodEntry, ...]] = {}  # a key's fields -> its sorted entries

    def close(self) -> None:
        """Close the connections this index opened (a client passed in stays open)."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> RedisIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- key names ----------------------------------------------------------------------
    def _request_name(self, key: int) -> bytes:
        return self._prefix + str(key).encode()

    def _engine_name(self, key: int) -> bytes:
        return self._engine_prefix + str(key).encode()

    def _key_of(self, name: bytes) -> int | None:
        """The request key a Redis key name holds, or ``None`` (engine set, foreign key)."""
        return _key_after(name, self._prefix)

    def _engine_key_of(self, name: bytes) -> int | None:
        """The engine key an engine-set name holds, or ``None``."""
        return _key_after(name, self._engine_prefix)

    def _entries(self, fields: list[bytes], pods: frozenset[str] | None = None) -> tuple[PodEntry, ...]:
        """The entries hash fields name (undecodable ones skipped, rule L13), of ``pods`` only
        (``None``: all), deduplicated and sorted by :func:`~kvlab.index.base.entry_sort_key`.
        The answer for a field list is cached (keys held by the same pods share one)."""
        fields = tuple(fields)
        ordered = self._sorted.get(fields)
        if ordered is None:
            held = {pair[0]: pair[1] for pair in map(self._decode, fields) if pair is not None}
            ordered = tuple(held[key] for key in sorted(held))
            if len(self._sorted) >= _SORTED_CACHE_SIZE:
                self._sorted.clear()
            self._sorted[fields] = ordered
        return ordered if pods is None else tuple(e for e in ordered if e.pod in pods)

    def _decode(self, field: bytes) -> tuple[tuple, PodEntry] | None:
        """``(sort key, entry)`` of a hash field, or ``None`` when it does not decode; cached."""
        pair = self._decoded.get(field, False)
        if pair is False:
            try:
                entry = PodEntry.from_json(field)
                pair = entry_sort_key(entry), entry
            except ValueError:
                pair = None
            if len(self._decoded) >= _DECODED_CACHE_SIZE:
                self._decoded.clear()
            self._decoded[field] = pair
        return pair

    def _scan(self) -> Iterator[list[bytes]]:
        """Batches of the key names under this namespace (``SCAN MATCH <namespace>*``), any kind."""
        match = re.sub(r"([*?\[\]\\])", r"\\\1", self.namespace) + "*"
        cursor = 0
        while True:
            cursor, names = self.client.scan(cursor, match=match, count=SCAN_BATCH_KEYS)
            yield names
            if cursor == 0:
                return

    def _scan_request_names(self) -> Iterator[list[bytes]]:
        """Batches of this namespace's request-key hash names."""
        for names in self._scan():
            names = [name for name in names
                     if not name.startswith(self._engine_prefix) and self._key_of(name) is not None]
            if names:
                yield names

    def flush(self) -> int:
        """Delete every key of this index: the request-key hashes ``<namespace><decimal>``
        and engine sets ``<namespace>engine:<decimal>``, scanned in batches of
        :data:`SCAN_BATCH_KEYS`; speculative expiry times are forgotten. Other keys stay,
        those of a longer namespace too (``"kv:"`` leaves ``"kv:b:1"``), so with namespace
        ``""`` only keys named as llm-d's layout names them go.

        Unlike :meth:`clear` (one pod's entries; engine mappings stay, rule L8), this
        empties the index, mappings included: a fresh start for a replay.

        Returns:
            The number of keys deleted.
        """
        deleted = 0
        for names in self._scan():
            mine = [name for name in names if self._key_of(name) is not None or self._engine_key_of(name) is not None]
            if mine:
                deleted += self.client.delete(*mine)
        self._speculative.clear()
        return deleted

    def _hkeys(self, names: list[bytes]) -> list[list[bytes]]:
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hkeys(name)
        return pipe.execute()

    # ---- backend primitives -------------------------------------------------------------
    def _add(self, triples: list[tuple[int, int, int]] | None, request_keys: list[int], entries: list[PodEntry],
             parent: int | None) -> None:  # noqa: ARG002 - the Index contract's signature; a flat index keeps no parents
        fields = dict.fromkeys((entry.to_json() for entry in entries), "")
        pipe = self.client.pipeline(transaction=True)
        for key in request_keys:
            pipe.hset(self._request_name(key), mapping=fields)
        members: dict[int, dict[str, int]] = {}
        for engine_key, request_key, position in triples or ():
            members.setdefault(engine_key, {})[str(request_key)] = position
        for engine_key, scores in members.items():
            pipe.zadd(self._engine_name(engine_key), scores)
        pipe.execute()

    def _lookup(self, request_keys: list[int], pods: frozenset[str] | None,
                stop_at_miss: bool) -> dict[int, tuple[PodEntry, ...]]:
        out: dict[int, tuple[PodEntry, ...]] = {}
        for key, fields in zip(request_keys, self._hkeys([self._request_name(k) for k in request_keys])):
            entries = self._entries(fields, pods)
            if entries:
                out[key] = entries
            elif stop_at_miss:
                break
        return out

    def _evict(self, key: int, key_type: str, entries: list[PodEntry]) -> None:
        fields = [entry.to_json() for entry in entries]
        if key_type == ENGINE_KEY:
            names = [self._request_name(k) for k in self._request_keys_of(key)]
            if not names:
                return  # an unknown engine key is a no-op (rule L7)
        else:
            names = [self._request_name(key)]
        pipe = self.client.pipeline(transaction=True)
        for name in names:
            pipe.hdel(name, *fields)
        self._prune_request_keys(keys=names, client=pipe)
        if key_type == ENGINE_KEY:
            self._prune_engine_key(keys=[self._engine_name(key), *names], client=pipe)
        pipe.execute()

    def _clear(self, pod: str, tier: str | None) -> None:
        for names in self._scan_request_names():
            doomed: dict[bytes, list[bytes]] = {}
            for name, fields in zip(names, self._hkeys(names)):
                for field in fields:
                    pair = self._decode(field)
                    if pair is not None and pair[1].pod == pod and (tier is None or pair[1].tier == tier):
                        doomed.setdefault(name, []).append(field)
            if doomed:
                pipe = self.client.pipeline(transaction=True)
                for name, fields in doomed.items():
                    pipe.hdel(name, *fields)
                self._prune_request_keys(keys=list(doomed), client=pipe)
                pipe.execute()

    def _request_keys_of(self, engine_key: int) -> list[int]:
        members = self.client.zrange(self._engine_name(engine_key), 0, -1)  # by (score, member bytes)
        return [int(m) for m in members if m.isdigit()]

    def _items(self) -> Iterator[tuple[int, Iterable[PodEntry]]]:
        for names in self._scan_request_names():
            for name, fields in zip(names, self._hkeys(names)):
                yield self._key_of(name), self._entries(fields)


def _key_after(name: bytes, prefix: bytes) -> int | None:
    """The u64 key (> 0) written in decimal right after ``prefix`` in ``name``, or ``None``."""
    rest = name[len(prefix):]
    if not name.startswith(prefix) or not rest.isdigit():
        return None
    key = int(rest)
    return key if 0 < key < 2**64 else None
