"""What ``import kvlab`` and ``kvlab --help`` load, each in a fresh interpreter (the cost is measured
in ``benchmarks/bench_import.py``, not here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import kvlab

#: Notebook-side libraries only kvlab.viz, kvlab.ui and kvlab.cli's chart writers import.
NOTEBOOK_LIBRARIES = ("altair", "ipywidgets", "anywidget", "vl_convert")


def loaded_after(code: str) -> set[str]:
    """The top-level modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def kvlab_modules_after(code: str) -> set[str]:
    """The ``kvlab.*`` modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('kvlab'))))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_kvlab_loads_no_other_kvlab_module_and_no_third_party_library() -> None:
    assert kvlab_modules_after("import kvlab") == {"kvlab"}
    assert not loaded_after("import kvlab") & {"numpy", "polars", "numba", *NOTEBOOK_LIBRARIES}


def test_kvlab_help_loads_no_notebook_library() -> None:
    code = ("import contextlib, io\nfrom kvlab.cli import main\n"
            "try:\n    with contextlib.redirect_stdout(io.StringIO()):\n        main(['--help'])\n"
            "except SystemExit as stop:\n    assert stop.code == 0, stop.code")
    loaded = loaded_after(code)
    assert "kvlab" in loaded and not loaded & set(NOTEBOOK_LIBRARIES)
    assert not kvlab_modules_after(code) & {"kvlab.sim", "kvlab.viz", "kvlab.ui", "kvlab.index"}


def test_local_sweeps_do_not_load_dask() -> None:
    code = ("from kvlab.sim import sweep\nfrom kvlab.sim.cluster import sweep as cluster_sweep\n"
            "from kvlab.traces import load_trace\ntrace = load_trace('conversation').head(5)\n"
            "sweep(trace, [10], executor='serial')\n"
            "cluster_sweep(trace, {'num_workers': [1]}, executor='serial')")
    assert not loaded_after(code) & {"dask", "distributed"}


def test_the_validation_helpers_and_semantics_do_not_load_polars() -> None:
    assert "polars" not in loaded_after("from kvlab.core.validate import check_int\n"
                                        "from kvlab.core import TOUCH_ORDERS")


def test_front_door_names_load_on_first_use() -> None:
    assert kvlab.load_trace is __import__("kvlab.traces", fromlist=["load_trace"]).load_trace
    assert kvlab.sim is sys.modules["kvlab.sim"] and kvlab.mrc is kvlab.sim.mrc
    assert set(kvlab.__all__) <= set(dir(kvlab)) and {"sim", "viz", "paths"} <= set(dir(kvlab))
    with pytest.raises(AttributeError, match="module 'kvlab' has no attribute 'replay_everything'"):
        kvlab.replay_everything  # noqa: B018 - the attribute access is the test


def test_every_front_door_name_exists() -> None:
    for name in kvlab.__all__:
        assert getattr(kvlab, name) is not None, name
