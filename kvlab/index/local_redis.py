"""A throw-away ``redis-server`` on a free loopback port, for notebooks, tests and benchmarks.

Used with :class:`~kvlab.index.redis_index.RedisIndex` (llm-d's Redis backend); the server's
folder and process go away when it is stopped, closed as a context manager or collected.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

import redis

from kvlab.index.redis_index import _CLIENT_OPTIONS


class LocalRedisServer:
    """A throw-away ``redis-server`` on a free loopback port: no persistence, files in a
    temporary folder, stopped by :meth:`stop` (or the ``with`` block, or at interpreter exit).

    For notebooks, tests and benchmarks of :class:`RedisIndex`; not a production setup.

    Args:
        executable: the ``redis-server`` program (a name on ``PATH`` or a path).
        startup_timeout_s: seconds to wait for the server to answer ``PING``.

    Attributes:
        port: the TCP port on 127.0.0.1.
        url: ``redis://127.0.0.1:<port>``.

    Raises:
        FileNotFoundError: ``executable`` is not installed (the message says how to install it).
        RuntimeError: the server did not start (the message quotes its log).

    Example:
        >>> with LocalRedisServer() as server:
        ...     redis.Redis.from_url(server.url).ping()
        True
    """

    def __init__(self, executable: str = "redis-server", *, startup_timeout_s: float = 10.0) -> None:
        path = shutil.which(executable)
        if path is None:
            raise FileNotFoundError(f"{executable!r} not found: install Redis (Debian/Ubuntu: "
                                    "`apt-get install redis-server`) or pass executable=PATH")
        for _ in range(5):  # a free port may be taken between probing and binding: retry
            self.port = _free_loopback_port()
            self.url = f"redis://127.0.0.1:{self.port}"
            folder = Path(tempfile.mkdtemp(prefix="kvlab-redis-"))
            log = folder / "redis.log"
            self._process = subprocess.Popen(
                [path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(folder), "--logfile", str(log)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._finalizer = weakref.finalize(self, _stop_server, self._process, folder)
            if self._wait_ready(startup_timeout_s):
                return
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            self._finalizer()
            if "Address already in use" not in tail:
                raise RuntimeError(f"redis-server did not start on port {self.port}; its log:\n{tail}")
        raise RuntimeError("redis-server found no free loopback port in 5 attempts")

    def _wait_ready(self, timeout_s: float) -> bool:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1.0, **_CLIENT_OPTIONS)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and self._process.poll() is None:
                try:
                    return bool(client.ping())
                except redis.exceptions.ConnectionError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server and delete its folder (idempotent)."""
        self._finalizer()

    def __enter__(self) -> LocalRedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop_server(process: subprocess.Popen, folder: Path) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(folder, ignore_errors=True)
