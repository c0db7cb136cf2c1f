"""Redis fixtures (a pytest plugin registered by conftest.py): one throw-away server per session.

``redis_server`` starts its own ``redis-server`` on a free loopback port
(:class:`kvlab.index.local_redis.LocalRedisServer`) and stops it after the session. Without
``redis-server`` the Redis tests skip with the reason, except under ``CI=true``, where
they fail: CI must run them (``.ci/run`` installs Debian's ``redis-server``).
``redis_index_factory`` makes :class:`~kvlab.index.redis_index.RedisIndex` objects, each on
a fresh namespace, so indexes made in one test never see each other's keys.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable, Iterator

import pytest

from kvlab.index.local_redis import LocalRedisServer
from kvlab.index.redis_index import RedisIndex

_NAMESPACES = itertools.count()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedisServer]:
    """A ``redis-server`` of this test session on 127.0.0.1 (skip without one; fail in CI)."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but redis-server is not installed; the Redis tests must run in CI "
                        "(.ci/run installs it: apt-get install -y redis-server)")
        pytest.skip("redis-server not installed: apt-get install redis-server")
    with LocalRedisServer() as server:
        yield server


@pytest.fixture
def redis_index_factory(redis_server: LocalRedisServer) -> Iterator[Callable[..., RedisIndex]]:
    """``make(**kwargs) -> RedisIndex`` on the session server, each call on a fresh namespace
    (``namespace=`` may be passed); the indexes are closed and the database flushed after the test."""
    made: list[RedisIndex] = []

    def make(**kwargs: object) -> RedisIndex:
        kwargs.setdefault("namespace", f"t{next(_NAMESPACES)}:")
        index = RedisIndex(redis_server.url, **kwargs)
        made.append(index)
        return index

    yield make
    for index in made:
        index.close()
    with RedisIndex(redis_server.url) as index:
        index.client.flushdb()
