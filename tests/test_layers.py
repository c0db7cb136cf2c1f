"""The layer order of ``docs/DESIGN.md`` (the one place it is written), held against every import in ``kvlab/``.

The test reads the order from the Layers table of ``docs/DESIGN.md`` (lowest first), walks the
AST of every module of the package (imports at the top, inside functions, under
``TYPE_CHECKING``, relative ones, and ``importlib.import_module("...")`` with a literal name) and
fails naming ``file:line`` for each import that points up the order, and for altair, ipywidgets,
anywidget or vl-convert imported outside ``kvlab.viz``, ``kvlab.ui`` and ``kvlab.cli``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvlab"
DESIGN = ROOT / "docs" / "DESIGN.md"

#: Notebook-side libraries: only these layers import them.
UI_LIBRARIES = frozenset({"altair", "ipywidgets", "anywidget", "vl_convert"})
UI_LAYERS = frozenset({"viz", "ui", "cli"})


def layer_order(design: str) -> dict[str, int]:
    """``{package: rank}`` from the first table of the ``## Layers`` section (``kvlab.core`` → 0);
    packages named on one row (``kvlab.core``, ``kvlab.paths``) share a rank.

    Raises:
        ValueError: no Layers section, or a table without ``kvlab.*`` rows.
    """
    match = re.search(r"^## Layers\n(.*?)(?=^## )", design, flags=re.S | re.M)
    if match is None:
        raise ValueError("docs/DESIGN.md has no '## Layers' section")
    ranks: dict[str, int] = {}
    for line in match.group(1).splitlines():
        if not line.startswith("| `kvlab."):
            continue
        first_cell = line.split("|")[1]
        rank = len(set(ranks.values()))
        for name in re.findall(r"`kvlab\.(\w+)`", first_cell):
            ranks[name] = rank
    if not ranks:
        raise ValueError("the Layers table of docs/DESIGN.md names no kvlab package")
    return ranks


ORDER = layer_order(DESIGN.read_text(encoding="utf-8"))


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``kvlab/index/base.py`` → ``kvlab.index.base``; ``kvlab/index/__init__.py`` → ``kvlab.index``."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer a ``kvlab.*`` module belongs to (``kvlab.paths`` → ``paths``), ``None`` for ``kvlab`` itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return parts[1]


def front_door_exports(package: Path = PACKAGE) -> dict[str, str]:
    """``{name: module}`` of the lazy front door (``_EXPORTS`` in ``kvlab/__init__.py``), read from its AST."""
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
                and "_EXPORTS" in [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                                   if isinstance(t, ast.Name)]):
            return ast.literal_eval(node.value)
    return {}


def imported_modules(tree: ast.AST, module: str, is_package: bool, exports: dict[str, str]) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``tree``, wherever it is.

    Relative imports are resolved against ``module``; ``from kvlab import name`` yields the
    submodule ``kvlab.name`` or, for a name of the front door, the module ``exports`` gives
    (``__version__`` and the like yield nothing); ``importlib.import_module("literal")`` counts.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                source = ".".join(base[:len(base) - (node.level - 1)] + ([source] if source else []))
            if source == "kvlab":
                found += [(node.lineno, exports.get(alias.name, f"kvlab.{alias.name}")) for alias in node.names
                          if not alias.name.startswith("__")]
            else:
                found.append((node.lineno, source))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            found.append((node.lineno, node.args[0].value))
    return sorted(found)


def violations(path: Path, source: str, *, package: Path = PACKAGE, order: dict[str, int] = ORDER) -> list[str]:
    """``file:line: ...`` for each import in ``source`` (the module at ``path`` under ``package``)
    against the layer ``order``: a ``kvlab`` layer above the module's own, a package missing from
    the order, a notebook-side library outside viz/ui/cli."""
    module = module_name(path, package)
    here = layer_of(module)
    where = path.relative_to(package.parent)
    if here is None:  # kvlab/__init__.py: the lazy front door, above every layer (test_import.py holds it lazy)
        return []
    if here not in order:
        return [f"{where}:1: kvlab.{here} is not in the Layers table of docs/DESIGN.md"]
    exports = front_door_exports(package) if (package / "__init__.py").exists() else {}
    found = []
    for line, target in imported_modules(ast.parse(source, str(where)), module, path.name == "__init__.py", exports):
        top, there = target.split(".")[0], layer_of(target)
        if top in UI_LIBRARIES and here not in UI_LAYERS:
            found.append(f"{where}:{line}: kvlab.{here} imports {target} (only kvlab.viz, kvlab.ui, kvlab.cli may)")
        elif top != "kvlab" or there is None or there == here:
            continue
        elif there not in order:
            found.append(f"{where}:{line}: kvlab.{here} imports {target}: kvlab.{there} is not in the Layers table")
        elif order[there] > order[here]:
            found.append(f"{where}:{line}: kvlab.{here} imports {target}, a layer above kvlab.{here}")
    return found


def test_the_order_read_from_design_md() -> None:
    by_rank = sorted(ORDER, key=ORDER.__getitem__)
    assert by_rank == ["core", "paths", "hashing", "traces", "policies", "events", "tiers", "engines", "index",
                       "blend", "sim", "viz", "ui", "cli"]
    assert ORDER["core"] == ORDER["paths"] == 0 and ORDER["hashing"] == 1


def test_every_kvlab_import_points_down_the_layer_order() -> None:
    found = [v for path in sorted(PACKAGE.rglob("*.py")) for v in violations(path, path.read_text(encoding="utf-8"))]
    assert found == [], "imports against the layer order of docs/DESIGN.md:\n" + "\n".join(found)


def test_every_package_and_module_of_kvlab_is_in_the_layers_table() -> None:
    names = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    names |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert sorted(names - set(ORDER)) == []


def test_the_front_door_exports_are_read() -> None:
    exports = front_door_exports()
    assert exports["replay"] == "kvlab.sim" and exports["load_trace"] == "kvlab.traces"


BAD_TRACES_MODULE = """\
from __future__ import annotations
from typing import TYPE_CHECKING
import numpy as np
from kvlab.core.validate import check_int
from kvlab.hashing import BlockHasher
from . import trace
from kvlab.sim import replay
if TYPE_CHECKING:
    from kvlab.viz import occupancy_chart
def plot():
    import altair.vegalite as alt
    from ..tiers import store
    from .. import index, paths
    from kvlab import __version__, replay
    import importlib
    return importlib.import_module("kvlab.ui.stepper")
from kvlab.nowhere import thing
import vl_convert
"""


def test_a_bad_module_fails_naming_file_and_line(tmp_path: Path) -> None:
    package = tmp_path / "kvlab"
    package.mkdir()
    (package / "__init__.py").write_text('_EXPORTS = {"replay": "kvlab.sim"}\n')
    up = "a layer above kvlab.traces"
    assert violations(package / "traces" / "bad.py", BAD_TRACES_MODULE, package=package) == [
        f"kvlab/traces/bad.py:7: kvlab.traces imports kvlab.sim, {up}",
        f"kvlab/traces/bad.py:9: kvlab.traces imports kvlab.viz, {up}",
        "kvlab/traces/bad.py:11: kvlab.traces imports altair.vegalite (only kvlab.viz, kvlab.ui, kvlab.cli may)",
        f"kvlab/traces/bad.py:12: kvlab.traces imports kvlab.tiers, {up}",
        f"kvlab/traces/bad.py:13: kvlab.traces imports kvlab.index, {up}",
        f"kvlab/traces/bad.py:14: kvlab.traces imports kvlab.sim, {up}",
        f"kvlab/traces/bad.py:16: kvlab.traces imports kvlab.ui.stepper, {up}",
        "kvlab/traces/bad.py:17: kvlab.traces imports kvlab.nowhere: kvlab.nowhere is not in the Layers table",
        "kvlab/traces/bad.py:18: kvlab.traces imports vl_convert (only kvlab.viz, kvlab.ui, kvlab.cli may)",
    ]


def test_the_same_imports_are_fine_one_layer_up_and_ui_libraries_in_viz(tmp_path: Path) -> None:
    package = tmp_path / "kvlab"
    package.mkdir()
    (package / "__init__.py").write_text('_EXPORTS = {"replay": "kvlab.sim"}\n')
    source = BAD_TRACES_MODULE.replace("kvlab.nowhere", "kvlab.sim")
    assert violations(package / "cli" / "good.py", source, package=package) == []
    assert violations(package / "viz" / "charts.py", source, package=package) == [
        "kvlab/viz/charts.py:16: kvlab.viz imports kvlab.ui.stepper, a layer above kvlab.viz",
    ]


def test_a_design_md_without_the_table_is_an_error() -> None:
    with pytest.raises(ValueError, match="no '## Layers' section"):
        layer_order("# kvlab\n## Data model\n")
    with pytest.raises(ValueError, match="names no kvlab package"):
        layer_order("## Layers\n| package | owns |\n|---|---|\n## Next\n")
