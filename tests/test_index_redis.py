"""RedisIndex on a real redis-server: llm-d's raw key layout (rule L13), Lua pruning (T-L7, T-L8,
T-L10 on raw keys), clear across SCAN batches, URL handling, namespaces, and a model-based
property test. The shared contract scenarios run in test_index_contract.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.index import PodEntry
from kvlab.index.local_redis import LocalRedisServer
from kvlab.index.redis_index import SCAN_BATCH_KEYS, RedisIndex, redis_url

A_GPU = '{"PodIdentifier":"pod-a","DeviceTier":"gpu","Speculative":false,"HasGroup":false,"GroupIdx":0}'
B_CPU_G1 = '{"PodIdentifier":"pod-b","DeviceTier":"cpu","Speculative":false,"HasGroup":true,"GroupIdx":1}'
A, A_CPU, B = PodEntry("pod-a"), PodEntry("pod-a", "cpu"), PodEntry("pod-b")


def raw_keys(index: RedisIndex) -> set[str]:
    return {k.decode() for k in index.client.scan_iter(match=index.namespace + "*", count=1000)}


def fields(index: RedisIndex, key: int) -> dict[str, str]:
    return {f.decode(): v.decode() for f, v in index.client.hgetall(f"{index.namespace}{key}").items()}


def scores(index: RedisIndex, engine_key: int) -> list[tuple[str, float]]:
    members = index.client.zrange(f"{index.namespace}engine:{engine_key}", 0, -1, withscores=True)
    return [(m.decode(), s) for m, s in members]


# ---- layout (rule L13) -------------------------------------------------------------------
def test_add_writes_a_hash_per_request_key_with_json_fields_and_an_engine_zset(redis_index_factory):
    index = redis_index_factory(namespace="kv:")
    index.add([100, 200], [1000, 2000], [A, PodEntry("pod-b", "CPU", group=1)])
    assert raw_keys(index) == {"kv:1000", "kv:2000", "kv:engine:100", "kv:engine:200"}
    assert index.client.type("kv:1000") == b"hash" and index.client.type("kv:engine:100") == b"zset"
    assert fields(index, 1000) == fields(index, 2000) == {A_GPU: "", B_CPU_G1: ""}
    assert scores(index, 100) == [("1000", 0.0)] and scores(index, 200) == [("2000", 1.0)]


def test_engine_zset_scores_are_mapping_positions_many_to_one_and_one_to_many(redis_index_factory):
    index = redis_index_factory()
    index.add([10, 11, 12, 13], [9000], [A])  # T-L7 layout: four engine keys -> one request key
    index.add([500], [5000, 5001, 5002, 5003], [A])  # T-L8 layout: one engine key -> four
    assert [scores(index, e) for e in (10, 11, 12, 13)] == [[("9000", 0.0)], [("9000", 1.0)], [("9000", 2.0)],
                                                          [("9000", 3.0)]]
    assert scores(index, 500) == [("5000", 0.0), ("5001", 1.0), ("5002", 2.0), ("5003", 3.0)]
    assert [index.get_request_key(e) for e in (10, 13, 500)] == [9000, 9000, 5003]


def test_re_add_unions_members_and_ties_order_by_decimal_string(redis_index_factory):
    index = redis_index_factory()
    index.add([7], [9], [A])
    index.add([7], [10, 11], [B])
    assert scores(index, 7) == [("10", 0.0), ("9", 0.0), ("11", 1.0)]  # ZRANGE: (score, member string)
    assert index._request_keys_of(7) == [10, 9, 11]
    index.evict(7, "engine", [B])  # 11 empty; 9 still holds pod-a: the mapping stays
    assert index.get_request_key(7) == 11 and scores(index, 7)[0] == ("10", 0.0)
    index.add([8], [9], [A])
    index.add([8], [10], [A])
    assert index.get_request_key(8) == 9  # tie at position 0: the larger decimal string, "9" > "10"


def test_lookup_skips_undecodable_fields_and_reads_fields_written_by_llm_d(redis_index_factory):
    index = redis_index_factory()
    index.client.hset(f"{index.namespace}1000", mapping={"pod-a@gpu": "", "{not json": "", A_GPU: ""})
    index.client.hset(f"{index.namespace}2000", mapping={"pod-a@gpu": ""})  # only an old-layout field (L14)
    index.client.hset(f"{index.namespace}3000", mapping={B_CPU_G1: ""})
    assert index.lookup([1000, 2000, 3000]) == {1000: (A,)}
    assert index.lookup([1000, 2000, 3000], stop="never") == {1000: (A,), 3000: (PodEntry("pod-b", "cpu", group=1),)}
    assert index.lookup([3000], pods=["pod-a"]) == {}
    assert dict(index.items()) == {1000: (A,), 3000: (PodEntry("pod-b", "cpu", group=1),)}


def test_speculative_entry_is_a_json_field_and_expires_to_no_key(redis_index_factory):
    index = redis_index_factory()
    index.add_speculative([1000], "pod-a", now_s=0.0, ttl_s=2.0)
    assert fields(index, 1000) == {A_GPU.replace('"Speculative":false', '"Speculative":true'): ""}
    assert index.expire(1.9) == 0 and index.expire(2.0) == 1
    assert raw_keys(index) == set()


# ---- Lua pruning on raw keys (T-L7, T-L8, T-L10) -----------------------------------------------
def test_t_l7_evict_one_of_many_engine_keys_empties_the_request_key(redis_index_factory):
    index = redis_index_factory()
    index.add([10, 11, 12, 13], [9000], [A])
    index.evict(10, "engine", [A])
    ns = index.namespace
    assert raw_keys(index) == {f"{ns}engine:11", f"{ns}engine:12", f"{ns}engine:13"}  # stale, resolve to nothing
    assert index.lookup([9000]) == {} and index.get_request_key(11) == 9000


def test_t_l8_evict_one_engine_key_empties_all_its_request_keys_and_drops_the_zset(redis_index_factory):
    index = redis_index_factory()
    index.add([500], [5000, 5001, 5002, 5003], [A, B])
    index.evict(500, "engine", [A])
    assert raw_keys(index) == {f"{index.namespace}{k}" for k in (5000, 5001, 5002, 5003)} | {
        f"{index.namespace}engine:500"}
    index.evict(500, "engine", [B])
    assert raw_keys(index) == set() and index.get_request_key(500) is None


def test_t_l10_a_cpu_copy_keeps_the_engine_zset_until_it_is_evicted(redis_index_factory):
    index = redis_index_factory()
    index.add([1], [100], [A])
    index.add(None, [100], [A_CPU])
    index.evict(1, "engine", [A])
    assert fields(index, 100) == {A_GPU.replace('"gpu"', '"cpu"'): ""} and scores(index, 1) == [("100", 0.0)]
    index.evict(1, "engine", [A_CPU])
    assert raw_keys(index) == set()


def test_evicting_absent_entries_keeps_everything_and_unknown_engine_key_is_a_no_op(redis_index_factory):
    index = redis_index_factory()
    index.add([1], [100], [A])
    before = raw_keys(index)
    index.evict(1, "engine", [B, PodEntry("pod-a", group=0)])
    index.evict(99, "engine", [A])
    index.evict(100, "request", [A_CPU])
    assert raw_keys(index) == before and fields(index, 100) == {A_GPU: ""}


def test_evict_through_a_stale_mapping_drops_the_zset(redis_index_factory):
    index = redis_index_factory()
    index.add([1, 2], [100, 200], [A])
    index.clear("pod-a")  # rule L8: mappings stay
    assert raw_keys(index) == {f"{index.namespace}engine:1", f"{index.namespace}engine:2"}
    index.evict(1, "engine", [A])
    assert raw_keys(index) == {f"{index.namespace}engine:2"}


# ---- clear across SCAN batches -------------------------------------------------------------
def test_clear_pod_and_tier_across_many_scan_batches(redis_index_factory):
    index = redis_index_factory()
    n = 3 * SCAN_BATCH_KEYS + 7
    keys = list(range(1, n + 1))
    index.add(keys, keys, [A])
    index.add(None, keys[::2], [A_CPU, PodEntry("pod-a", speculative=True)])
    index.add(None, keys[::3], [B])
    other = redis_index_factory()
    other.add(None, keys[:50], [A])
    index.clear("pod-a", "gpu")
    assert index.pod_tier_counts() == {"pod-a": {"cpu": len(keys[::2])}, "pod-b": {"gpu": len(keys[::3])}}
    assert index.pod_keys("pod-a", "gpu", speculative=True) == set()
    index.clear("pod-a")
    assert {k: e for k, e in index.items()} == {k: (B,) for k in keys[::3]}
    assert len(raw_keys(index)) == len(keys[::3]) + n  # pruned hashes gone; engine sets stay (rule L8)
    assert other.pod_tier_counts() == {"pod-a": {"gpu": 50}}


# ---- namespaces, clients, URLs, errors ------------------------------------------------------
def test_indexes_on_other_namespaces_do_not_see_each_other(redis_index_factory):
    first, second, root = redis_index_factory(), redis_index_factory(), redis_index_factory(namespace="")
    first.add([1], [100], [A])
    root.add([1], [100], [B])
    assert second.lookup([100]) == {} and list(second.items()) == [] and second.get_request_key(1) is None
    second.clear("pod-a")
    root.clear("pod-a")
    assert first.lookup([100]) == {100: (A,)} and dict(root.items()) == {100: (B,)}
    assert raw_keys(root) >= {f"{first.namespace}100", f"{first.namespace}engine:1", "100", "engine:1"}


def test_flush_deletes_only_this_index_keys_mappings_included(redis_index_factory):
    index, longer, root = (redis_index_factory(namespace="f:"), redis_index_factory(namespace="f:b:"),
                           redis_index_factory(namespace=""))
    index.add([1, 2], [100, 200], [A])
    index.add_speculative([300], "pod-b", now_s=0.0)
    index.client.set("f:note", "kept")  # not of the layout: a foreign key under the prefix
    longer.add([1], [100], [B])
    root.add([1], [100], [B])
    assert index.flush() == 5  # f:100, f:200, f:300, f:engine:1, f:engine:2
    assert raw_keys(index) == {"f:note", "f:b:100", "f:b:engine:1"}
    assert list(index.items()) == [] and index.get_request_key(1) is None and index.expire(10.0) == 0
    assert dict(longer.items()) == {100: (B,)} and dict(root.items()) == {100: (B,)}
    assert root.flush() == 2 and index.client.get("f:note") == b"kept" and dict(longer.items()) == {100: (B,)}
    index.add([1], [100], [A])
    assert index.lookup([100]) == {100: (A,)} and index.get_request_key(1) == 100


def test_a_client_passed_in_is_used_and_left_open(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    with RedisIndex(client, namespace="given:") as index:
        index.add(None, [5], [A])
    assert client.hkeys("given:5") == [A_GPU.encode()]
    client.delete("given:5")
    client.close()


@pytest.mark.parametrize(("address", "url"), [
    ("127.0.0.1:6379", "redis://127.0.0.1:6379"),
    ("cache.local:7000/2", "redis://cache.local:7000/2"),
    ("redis://h:1", "redis://h:1"),
    ("rediss://h:1", "rediss://h:1"),
    ("valkey://h:6379", "redis://h:6379"),
    ("valkeys://h:6380", "rediss://h:6380"),
    ("VALKEY://h:6379", "redis://h:6379"),
    ("unix:///run/redis.sock", "unix:///run/redis.sock"),
])
def test_redis_url_normalises_like_llm_d(address, url):
    assert redis_url(address) == url


@pytest.mark.parametrize("address", ["", "  ", "http://h:1", "redis://", "redis:///0", 6379, None])
def test_redis_url_rejects_bad_addresses(address):
    with pytest.raises(ValueError, match="url"):
        redis_url(address)


@pytest.mark.parametrize("namespace", ["ns1", 3, None])
def test_namespace_must_be_a_string_not_ending_with_a_digit(redis_server, namespace):
    with pytest.raises(ValueError, match="namespace"):
        RedisIndex(redis_server.url, namespace=namespace)


def test_no_server_raises_connection_error_naming_the_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match=rf"^cannot reach a Redis server at redis://127\.0\.0\.1:{port}: the "
                                              rf"connection failed \(ConnectionError: .*refused.*redis-server --port"):
        RedisIndex(f"127.0.0.1:{port}")


def resp_commands(data: bytes) -> list[str]:
    """The command names in ``data``, a client's RESP requests (arrays of bulk strings)."""
    names, pos = [], 0
    while pos < len(data):
        end = data.index(b"\r\n", pos)
        assert data[pos:pos + 1] == b"*", data[pos:]
        count, pos, parts = int(data[pos + 1:end]), end + 2, []
        for _ in range(count):
            end = data.index(b"\r\n", pos)
            length = int(data[pos + 1:end])
            parts.append(data[end + 2:end + 2 + length])
            pos = end + 2 + length + 2
        names.append(parts[0].decode().upper())
    return names


class FakeServer:
    """A loopback server answering every request with ``reply`` bytes (``None``: it reads and
    never replies); it records each connection's requests until the client closes it."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.received: list[bytearray] = []  # per connection
        self.handlers: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed at teardown
                return
            self.received.append(data := bytearray())
            self.handlers.append(handler := threading.Thread(target=self._serve, args=(conn, data), daemon=True))
            handler.start()

    def _serve(self, conn: socket.socket, data: bytearray) -> None:
        with conn:
            while chunk := conn.recv(65536):
                data += chunk
                if self.reply is not None:
                    conn.sendall(self.reply)

    def commands(self) -> list[list[str]]:
        """Per connection, the commands received, once every connection is closed by the client."""
        for handler in list(self.handlers):
            handler.join(timeout=10)
            assert not handler.is_alive(), "the client left a connection open"
        return [resp_commands(bytes(data)) for data in self.received]


@pytest.fixture
def fake_server() -> Iterator:
    """``start(reply) -> FakeServer`` (see :class:`FakeServer`), closed after the test."""
    servers: list[FakeServer] = []

    def start(reply: bytes | None) -> FakeServer:
        servers.append(server := FakeServer(reply))
        return server

    yield start
    for server in servers:
        server.listener.close()


@pytest.mark.parametrize(("reply", "cause"), [
    (b"HTTP/1.0 400 Bad request\r\n\r\n", r"what answers there does not speak the Redis protocol \(InvalidResponse: "),
    (b"-ERR unknown command 'PING'\r\n", r"the server refused PING \(ResponseError: unknown command"),
    (None, r"nothing answered PING within 0\.2 s; .* \(TimeoutError: "),
])
def test_a_port_that_does_not_talk_redis_raises_connection_error_naming_the_url(fake_server, reply, cause):
    server = fake_server(reply)
    with pytest.raises(ConnectionError, match=rf"^cannot reach a Redis server at redis://127\.0\.0\.1:{server.port}: "
                                              rf"{cause}"):
        RedisIndex(f"redis://127.0.0.1:{server.port}", connect_timeout_s=0.2)
    # one probe on one connection, no retry (redis-py's first request of a connection is its handshake)
    assert [len(commands) for commands in server.commands()] == [1]


def test_constructing_an_index_sends_one_ping(redis_server):
    """Counted by the server itself (INFO commandstats): the probe pings once."""
    with redis.Redis.from_url(redis_server.url) as admin:
        def pings() -> int:
            return admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)

        before = pings()
        with RedisIndex(redis_server.url):
            after = pings()
    assert after - before == 1


def test_a_passed_in_client_that_cannot_ping_raises_connection_error(fake_server):
    client = redis.Redis(port=fake_server(b"HTTP/1.0 400 Bad request\r\n\r\n").port)
    with pytest.raises(ConnectionError, match="does not speak the Redis protocol"):
        RedisIndex(client)
    client.close()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"connect_timeout_s": 0}, "connect_timeout_s must be a finite number > 0.0, got 0"),
    ({"connect_timeout_s": float("inf")}, "connect_timeout_s must be a finite number > 0.0, got inf"),
    ({"connect_timeout_s": True}, "connect_timeout_s must be a finite number > 0.0, got True"),
    ({"url": "redis://h:abc"}, "url 'redis://h:abc': Port could not be cast to integer"),
])
def test_bad_connection_arguments_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RedisIndex(**kwargs)


def test_local_server_stops_and_missing_executable_says_how_to_install(redis_server):
    server = LocalRedisServer()
    client = redis.Redis.from_url(server.url, socket_connect_timeout=1.0)
    assert client.ping() and server.port != redis_server.port
    server.stop()
    server.stop()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    with pytest.raises(FileNotFoundError, match="apt-get install redis-server"):
        LocalRedisServer("kvlab-no-such-redis-server")


# ---- model-based property: raw state equals a dict-of-sets reference ---------------------------
ENTRIES = [A, A_CPU, B, PodEntry("pod-b", group=1)]
OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(0, 3)),
    st.tuples(st.just("evict"), st.integers(1, 6), st.integers(0, 3)),
    st.tuples(st.just("clear"), st.sampled_from(["pod-a", "pod-b"]), st.sampled_from([None, "gpu", "cpu"])),
), max_size=12)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])  # fresh namespace each
@given(ops=OPS)
def test_random_operations_match_a_reference_model(redis_index_factory, ops):
    index = redis_index_factory()
    held: dict[int, set[PodEntry]] = {}  # request key -> entries; request key r is engine key r (1:1)
    mapped: set[int] = set()
    for op, arg, choice in ops:
        if op == "add":
            index.add(arg, [k * 1000 for k in arg], [ENTRIES[choice]])
            for k in arg:
                held.setdefault(k * 1000, set()).add(ENTRIES[choice])
            mapped.update(arg)
        elif op == "evict":
            index.evict(arg, "engine", [ENTRIES[choice]])
            if arg in mapped:
                held.get(arg * 1000, set()).discard(ENTRIES[choice])
                if not held.get(arg * 1000):
                    mapped.discard(arg)
        else:
            index.clear(arg, choice)
            for entries in held.values():
                entries -= {e for e in entries if e.pod == arg and choice in (None, e.tier)}
    expected = {k: set(v) for k, v in held.items() if v}
    assert {k: set(v) for k, v in index.items()} == expected
    assert raw_keys(index) == {f"{index.namespace}{k}" for k in expected} | {
        f"{index.namespace}engine:{e}" for e in mapped}


@pytest.mark.parametrize(("ci", "outcome", "message"), [
    ("true", "1 error", "CI=true but redis-server is not installed"),
    ("", "1 skipped", "redis-server not installed: apt-get install redis-server"),
])
def test_fixture_without_redis_server_fails_in_ci_and_skips_elsewhere(tmp_path, ci, outcome, message):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["redis_server"]\n')
    (tmp_path / "test_needs_redis.py").write_text("def test_it(redis_index_factory):\n    pass\n")
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PATH": str(tmp_path), "CI": ci,
           "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert outcome in run.stdout and message in run.stdout, run.stdout + run.stderr
