"""Where a sweep's runs execute: one function, :func:`run_tasks`, that every sweep calls.

A sweep is ``fn(item, trace)`` over a list of items (one per grid point) and one trace. The
executors, one helper each:

=============================  ==================================================================
executor                       how the trace reaches the runs
=============================  ==================================================================
``None``                       the sweep's default: threads (:func:`kvlab.sim.sweep`: shared
                               by the threads, its kernels release the GIL) or ``"processes"``
                               (:func:`kvlab.sim.cluster.sweep`); ``"serial"`` on one CPU
``"serial"``                   this process, in grid order
``"processes"``                ``spawn``-ed worker processes, one per CPU: sent once each,
                               through the pool's initializer
a ``concurrent.futures``       with every task (the executor is the caller's: kvlab neither
``Executor``                   starts nor shuts it down)
a ``dask.distributed.Client``  scattered once to every Dask worker
                               (``client.scatter(trace, broadcast=True)``); each task takes the
                               future, and Dask hands the worker its copy
``"tcp://HOST:PORT"``          a Dask scheduler's address: a client connected for the sweep,
                               closed after it (any address Dask takes, ``tls://`` too)
=============================  ==================================================================

Results come back as they finish (``concurrent.futures.as_completed`` or
``distributed.as_completed``: a progress bar moves with them) and are returned in grid order,
so a frame is the same whichever executor ran it. ``distributed`` is imported only when the
caller passes a client or an address (``import kvlab`` and local sweeps never load it).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from functools import partial

#: What ``executor`` may be, for the error message.
EXECUTORS_HELP = ("None, 'serial', 'processes', a concurrent.futures.Executor, a dask.distributed Client "
                  "or a Dask scheduler address ('tcp://HOST:PORT')")

_WORKER_TRACE: object = None  # the trace of a pool worker process (set by its initializer)


def _init_worker(trace: object) -> None:
    global _WORKER_TRACE
    _WORKER_TRACE = trace


def _with_worker_trace(fn: Callable[[object, object], object], item: object) -> object:
    return fn(item, _WORKER_TRACE)


#: URL schemes of Dask's communication backends (``distributed.comm``).
DASK_SCHEMES = ("tcp", "tls", "inproc", "ucx", "ws", "wss")


def is_scheduler_address(executor: object) -> bool:
    """Whether ``executor`` is a Dask scheduler address (a string ``scheme://...``).

    Raises:
        ValueError: a ``scheme://`` string whose scheme is none of :data:`DASK_SCHEMES` (no
            connection is tried).

    Example:
        >>> is_scheduler_address("tcp://10.0.0.1:8786"), is_scheduler_address("serial")
        (True, False)
    """
    if not isinstance(executor, str) or "://" not in executor:
        return False
    scheme = executor.split("://", 1)[0]
    if scheme not in DASK_SCHEMES:
        raise ValueError(f"a Dask scheduler address starts with one of {[s + '://' for s in DASK_SCHEMES]}, "
                         f"got {executor!r}")
    return True


def dask_client(executor: object) -> object | None:
    """``executor`` when it is a ``dask.distributed.Client``, else ``None`` — without importing
    ``distributed`` (a client exists only once ``distributed`` is loaded)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import Client

    return executor if isinstance(executor, Client) else None


def check_executor(executor: object) -> object:
    """``executor`` when :func:`run_tasks` can run on it.

    Raises:
        ValueError: anything else, naming the choices and the value.
    """
    if (executor is None or executor in ("serial", "processes") or is_scheduler_address(executor)
            or isinstance(executor, Executor) or dask_client(executor) is not None):
        return executor
    raise ValueError(f"executor must be {EXECUTORS_HELP}, got {executor!r}")


def run_tasks(fn: Callable[[object, object], object], items: Sequence[object], trace: object, executor: object, *,
              default: str, progress: bool = False, desc: str = "sweep") -> list:
    """``[fn(item, trace) for item in items]``, run on ``executor``; results in ``items`` order.

    Args:
        fn: a module-level function (it is pickled by reference for processes and Dask).
        items: the grid points (picklable).
        trace: the data every run shares (sent once per process or Dask worker).
        executor: see the module's table; ``None`` means ``default`` (``"threads"`` or
            ``"processes"``), or ``"serial"`` when there is one CPU or one item.
        default: what ``None`` runs on.
        progress: a tqdm bar on stderr, one step per finished run.
        desc: the bar's label.

    Raises:
        ValueError: an executor of another kind (before any run starts); and whatever a run raises.

    Example:
        >>> run_tasks(pow, [1, 2, 3], 2, "serial", default="threads")  # pow(item, trace)
        [1, 4, 9]
        >>> run_tasks(pow, [1, 2, 3], 2, None, default="threads")
        [1, 4, 9]
    """
    check_executor(executor)
    workers = min(os.cpu_count() or 1, len(items))
    if executor is None:
        executor = default if workers >= 2 else "serial"
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), unit="run", desc=desc, file=sys.stderr)
    try:
        if executor == "serial":
            return _run_serial(fn, items, trace, bar)
        if executor == "threads":
            with ThreadPoolExecutor(max_workers=workers) as pool:
                return _collect(as_completed, [pool.submit(fn, item, trace) for item in items], bar)
        if executor == "processes":
            with ProcessPoolExecutor(max_workers=max(workers, 1), mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_init_worker, initargs=(trace,)) as pool:
                return _collect(as_completed, [pool.submit(_with_worker_trace, fn, item) for item in items], bar)
        if isinstance(executor, Executor):
            return _collect(as_completed, [executor.submit(fn, item, trace) for item in items], bar)
        if is_scheduler_address(executor):
            from distributed import Client

            with Client(executor, set_as_default=False) as client:
                return _run_dask(client, fn, items, trace, bar)
        return _run_dask(executor, fn, items, trace, bar)
    finally:
        if bar is not None:
            bar.close()


def _run_serial(fn: Callable, items: Sequence[object], trace: object, bar: object) -> list:
    results = []
    for item in items:
        results.append(fn(item, trace))
        if bar is not None:
            bar.update()
    return results


def _run_dask(client: object, fn: Callable, items: Sequence[object], trace: object, bar: object) -> list:
    """Scatter ``trace`` to every worker once, submit one task per item holding its future."""
    from distributed import as_completed as dask_as_completed

    shared = client.scatter(trace, broadcast=True, hash=False)
    futures = [client.submit(fn, item, shared, pure=False) for item in items]
    try:
        return _collect(partial(dask_as_completed, loop=client.loop), futures, bar)  # not the default client's
    finally:
        client.cancel([*futures, shared])  # finished: frees the results and the trace on the workers


def _collect(finished: Callable[[list], Iterable], futures: list, bar: object) -> list:
    """The futures' results in submission order, taken as ``finished`` (``as_completed`` of
    ``concurrent.futures`` or of ``distributed``) yields them; the first error cancels the rest."""
    index = {future: i for i, future in enumerate(futures)}
    results: list = [None] * len(futures)
    try:
        for future in finished(futures):
            results[index[future]] = future.result()
            if bar is not None:
                bar.update()
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return results
