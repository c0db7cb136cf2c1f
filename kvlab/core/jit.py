"""``kernel_jit``: numba's ``njit`` with an on-disk compile cache that cannot go stale.

Every kvlab kernel is compiled with this decorator. numba's own ``cache=True`` keys a cached
kernel on the decorated function's file only, so an edit to a policy module whose hooks are
inlined into the replay driver (``overload(..., inline="always")``) would leave a stale
kernel in place. Here the cache lives in a folder named by a digest of

* the source of every module of the kvlab package (any edit anywhere makes a new folder),
* the Python, numba, llvmlite and numpy versions and the host CPU name,

and a signature that involves a type defined outside kvlab (a policy state class from a
user's module, whose hooks the digest does not cover) is compiled and never cached. Older
folders are pruned (the most recently used :data:`KEEP_FOLDERS` are kept).

Environment:

* ``KVLAB_CACHE_DIR``: root of the cache (default ``~/.cache/kvlab/jit``; the folder for the
  current digest is a child of it).
* ``KVLAB_JIT_CACHE=0``: compile afresh in every process (no disk access).

A folder that cannot be created or written (or a ``~user`` path of an unknown user) degrades to
compiling, never to an error, and a truncated or corrupt cache file is a miss. Both variables are
read once per process, at the first kernel call (compile or cache load).

>>> from kvlab.core.jit import kernel_jit
>>> @kernel_jit(nogil=True)
... def add_one(x):
...     return x + 1
>>> add_one(41)
42
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from functools import cache
from pathlib import Path
from typing import Any

#: How many digest folders survive a prune (other worktrees or versions may share the root).
KEEP_FOLDERS = 4
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def cache_enabled() -> bool:
    """Whether kernels are cached on disk (``KVLAB_JIT_CACHE`` is not ``0``/``false``/``no``/``off``)."""
    return os.environ.get("KVLAB_JIT_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_root() -> Path:
    """Root folder of the compile cache: ``$KVLAB_CACHE_DIR`` or ``~/.cache/kvlab/jit``."""
    configured = os.environ.get("KVLAB_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "kvlab" / "jit"


def source_digest() -> str:
    """Hex digest (16 characters) of kvlab's module sources, the toolchain versions and the CPU.

    Every ``*.py`` file under the package is hashed with its relative path, in sorted order.
    """
    import llvmlite
    import numba
    import numpy
    from llvmlite import binding

    h = hashlib.sha256()
    for part in (sys.version, numba.__version__, llvmlite.__version__, numpy.__version__,
                 binding.get_host_cpu_name()):
        h.update(part.encode() + b"\0")
    for path in sorted(_PACKAGE_ROOT.rglob("*.py")):
        h.update(path.relative_to(_PACKAGE_ROOT).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@cache
def cache_folder() -> Path | None:
    """The folder for this source digest (created, old siblings pruned), or None when the
    cache is disabled or the folder is not writable."""
    if not cache_enabled():
        return None
    try:
        folder = cache_root() / source_digest()
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        os.utime(folder)
    except (OSError, RuntimeError):  # RuntimeError: "~user" of an unknown user, or no home
        return None
    _prune(folder.parent, keep=folder)
    return folder


def _prune(root: Path, keep: Path) -> None:
    """Remove digest folders beyond the :data:`KEEP_FOLDERS` most recently used (best effort)."""
    try:
        folders = sorted((p for p in root.iterdir() if p.is_dir() and p != keep),
                         key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in folders[KEEP_FOLDERS - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def _is_foreign(ty: Any) -> bool:
    """Whether a numba type (or a tuple of them) names a class defined outside kvlab."""
    cls = getattr(ty, "instance_class", None)
    if isinstance(cls, type) and not (cls.__module__ == "kvlab" or cls.__module__.startswith("kvlab.")):
        return True
    return any(_is_foreign(t) for t in getattr(ty, "types", ()) or ())


@cache
def _cache_class() -> type:
    """numba's FunctionCache, located in :func:`cache_folder`, skipping foreign signatures."""
    from numba.core import caching

    class _Locator(caching.UserProvidedCacheLocator):
        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = os.path.join(str(cache_folder()), self.get_suitable_cache_subpath(py_file))

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if cache_folder() is None:
                return None
            return super(caching.UserProvidedCacheLocator, cls).from_function(py_func, py_file)

    class _Impl(caching.CompileResultCacheImpl):
        _locator_classes = [_Locator]

    class _KernelCache(caching.FunctionCache):
        _impl_class = _Impl

        def load_overload(self, sig: Any, target_context: Any) -> Any:
            if any(_is_foreign(t) for t in getattr(sig, "args", sig)):
                return None
            try:
                return super().load_overload(sig, target_context)
            except Exception:  # noqa: BLE001 - a truncated or corrupt cache file is a miss: compile
                return None

        def save_overload(self, sig: Any, data: Any) -> None:
            if not any(_is_foreign(t) for t in getattr(sig, "args", sig)):
                super().save_overload(sig, data)

    return _KernelCache


def kernel_jit(func: Any = None, **options: Any) -> Any:
    """``numba.njit(**options)`` plus kvlab's safe on-disk cache (see the module docstring).

    Use as ``@kernel_jit`` or ``@kernel_jit(nogil=True, inline="always", _nrt=False)``; any
    njit option is accepted except ``cache`` (always managed here). Returns numba's dispatcher.
    Raises ``ValueError`` when ``cache`` is given.
    """
    if "cache" in options:
        raise ValueError(f"kernel_jit manages the cache itself; got cache={options['cache']!r}")
    if func is None:
        return lambda f: kernel_jit(f, **options)

    from numba import njit

    dispatcher = njit(**options)(func)
    if options.get("inline") != "always" and cache_enabled():  # inlined helpers live in their callers' entries
        dispatcher._cache = _LazyCache(dispatcher.py_func)
    return dispatcher


class _LazyCache:
    """Stands in for numba's cache until the first compile: the digest and the cache files are
    only touched when a kernel is called (imports stay cheap); an unusable folder gives a null
    cache (compile in every process)."""

    def __init__(self, py_func: Any) -> None:
        self._py_func = py_func
        self._real: Any = None

    def _cache(self) -> Any:
        if self._real is None:
            from numba.core.caching import NullCache

            self._real = NullCache()
            if cache_folder() is not None:
                try:
                    self._real = _cache_class()(self._py_func)
                except (RuntimeError, OSError):
                    pass  # no usable folder for this file
        return self._real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache(), name)
