"""Servers for the browser tests and benchmarks: a process group that is always killed.

``ServerProcess`` starts a server (JupyterLab, Voilà) in its own process group with its output in
a temp log, waits until a URL answers 200, and on exit kills the group and every process the server
started in a session of its own (Jupyter starts kernels that way), also on a failure or Ctrl-C.
Re-exported by ``tests/browser_harness.py``, where the rest of the browser harness lives.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (bound to port 0 and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server started in its own process group, ready once ``ready_url`` answers HTTP 200.

    A context manager: ``__enter__`` starts ``argv`` (stdout and stderr to a temp log file) and
    polls ``ready_url`` every 0.2 s; ``__exit__`` kills the whole group (SIGTERM, SIGKILL after
    5 s) whatever happened, also on ``KeyboardInterrupt``, then removes ``cleanup_dirs``.

    Args:
        argv: the command. ready_url: polled until it answers 200. env: the environment
            (default: this process's). cwd: working directory. timeout_s: how long to wait.
        cleanup_dirs: directories removed after the server stopped (its temp state).

    Raises:
        RuntimeError: the process exited, or ``ready_url`` did not answer 200 within
            ``timeout_s`` (the message has the log's last lines).
    """

    def __init__(self, argv: Sequence[str], *, ready_url: str, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, timeout_s: float = 120.0,
                 cleanup_dirs: Sequence[str | Path] = ()) -> None:
        self.argv, self.ready_url, self.env, self.cwd = list(argv), ready_url, env, cwd
        self.timeout_s, self.cleanup_dirs = timeout_s, list(cleanup_dirs)
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def __enter__(self) -> ServerProcess:
        try:
            fd, log = tempfile.mkstemp(prefix="kvlab-server-", suffix=".log")
            self.log_path = Path(log)
            with os.fdopen(fd, "wb") as out:
                self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=None if self.env is None else dict(self.env), cwd=self.cwd,
                                             start_new_session=True)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with status {self.proc.returncode} before "
                                   f"{self.ready_url} answered; log tail:\n{self.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(self.ready_url, timeout=2) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.ready_url} did not answer 200 within {self.timeout_s:.0f} s; "
                                   f"log tail:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Kill the process group (SIGTERM, then SIGKILL after 5 s) and every process the server had
        started in a session of its own (Jupyter's kernels), remove the log and temp state. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None:
            descendants = _descendants(proc.pid)  # before the signal: once the server is gone they are orphans
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5.0)
                    break
            with contextlib.suppress(ProcessLookupError):  # children left in the group after the leader exited
                os.killpg(proc.pid, signal.SIGKILL)
            for pid, started in descendants:
                if _start_time(pid) == started:  # the same process, still alive
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            for _ in range(50):  # SIGKILL is delivered asynchronously: wait until they are dead
                if not any(_start_time(pid) == started and not _is_zombie(pid) for pid, started in descendants):
                    break
                time.sleep(0.05)
        for path in self.cleanup_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.cleanup_dirs = []
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)


def _start_time(pid: int) -> str | None:
    """``/proc/PID/stat``'s start time (tells a process from a later one with the same id); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _is_zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited and waits to be reaped (state Z)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _descendants(root: int) -> list[tuple[int, str]]:
    """Every live descendant of ``root`` as (pid, start time), from ``/proc`` (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None:
            found.append((pid, started))
        todo += children.get(pid, [])
    return found
