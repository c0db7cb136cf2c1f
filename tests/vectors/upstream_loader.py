"""Import vLLM 0.33.0 / LMCache 0.5.6's pure-Python hashing and event modules, unchanged, from a
scratch venv with the wheels installed ``--no-deps``; every other module they import is stubbed.

Used only by ``generate_upstream.py`` (not by the tests). The listed REAL modules run from the
installed files; their packages' ``__init__`` files are skipped; an upstream module that exists on
disk but is not REAL becomes a ``MagicMock`` module; a name that is not a module on disk is not
found (so ``__import__(pkg, fromlist=[attr])`` probes fail as in a real install). ``torch`` is a
tiny stand-in: ``Tensor`` (a class nothing is an instance of) and ``tensor(values)`` (a list).
``UPSTREAM_NO_VLLM=1`` makes every ``vllm`` import fail, as in a process without vLLM. Importing
this module changes nothing; :func:`install` sets the hooks up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import sysconfig
import types
from unittest import mock

SITE = sysconfig.get_paths()["purelib"]
REAL = {
    "vllm.utils.hashing", "vllm.v1.core.kv_cache_utils", "vllm.distributed.kv_events", "vllm.multimodal.utils",
    "vllm.utils.math_utils", "lmcache.v1.token_database", "lmcache.v1.multiprocess.token_hasher",
    "lmcache.integration.vllm.utils",
}
STUBBED_ROOTS = ("transformers", "zmq", "numba", "PIL")


def _file(name: str) -> str:
    return os.path.join(SITE, *name.split(".")) + ".py"


def _on_disk(name: str) -> bool:
    base = os.path.join(SITE, *name.split("."))
    return os.path.isdir(base) or os.path.exists(base + ".py") or any(
        f.startswith(os.path.basename(base) + ".") and f.endswith(".so")
        for f in (os.listdir(os.path.dirname(base)) if os.path.isdir(os.path.dirname(base)) else []))


class _Stub(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        if spec.name == "lmcache.utils":  # a MagicMock decorator would replace process_tokens itself
            module._lmcache_nvtx_annotate = lambda func, domain="lmcache": func  # nvtx ranges only
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _package_attr(package: str, attr: str) -> object:
    """A name the skipped ``__init__`` defines: a stub; a submodule or a name the ``__init__`` never
    mentions: AttributeError (so the submodule is imported, and absent names stay absent)."""
    init = os.path.join(SITE, *package.split("."), "__init__.py")
    source = open(init).read() if os.path.exists(init) else ""
    if attr.startswith("__") or _on_disk(f"{package}.{attr}") or not re.search(rf"\b{attr}\b", source):
        raise AttributeError(attr)
    return mock.MagicMock(name=f"{package}.{attr}")


class _Package(importlib.abc.Loader):
    """A package whose ``__init__`` is not run, so only the REAL submodules load."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = [os.path.join(SITE, *spec.name.split("."))]
        module.__getattr__ = lambda attr: _package_attr(spec.name, attr)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        root = name.split(".")[0]
        if root == "vllm" and os.environ.get("UPSTREAM_NO_VLLM") == "1":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if root in ("vllm", "lmcache"):
            if name in REAL:
                return importlib.util.spec_from_file_location(name, _file(name))
            if any(real.startswith(name + ".") for real in REAL):
                return importlib.machinery.ModuleSpec(name, _Package(), is_package=True)
            if _on_disk(name):
                return importlib.machinery.ModuleSpec(name, _Stub(), is_package=True)
            return None
        if root in STUBBED_ROOTS:
            return importlib.machinery.ModuleSpec(name, _Stub(), is_package=True)
        return None


def _torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})
    torch.tensor = lambda values, dtype=None: list(values)
    torch.__getattr__ = lambda attr: mock.MagicMock(name=f"torch.{attr}")
    return torch


def install() -> None:
    """Install the stand-in torch and the import hook (call it only in the generator's process)."""
    sys.modules["torch"] = _torch()
    sys.meta_path.insert(0, _Finder())
