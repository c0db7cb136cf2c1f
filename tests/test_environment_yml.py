"""environment.yml must mirror pyproject.toml (the one source of dependencies), in conda-forge's names.

The file is checked by name and version only: it is not solved here (no conda in CI).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
#: Every PyPI requirement of kvlab (runtime and dev) → its conda-forge package. Most are the same
#: name; a new dependency fails the test until its conda-forge name is looked up and added here.
#: Checked on anaconda.org/conda-forge: python-xxhash ("Python binding for xxHash"; conda-forge's
#: xxhash is the C library, 0.8.x), msgpack-python, redis-py (conda-forge's redis is the server),
#: blake3 ("Python bindings for the Rust blake3 crate"), hiredis ("Python wrapper for hiredis").
#: dask[distributed]: conda-forge's ``distributed`` (it requires dask-core of its own version, as
#: the PyPI extra pins distributed to dask's).
CONDA_NAMES = {
    "numpy": "numpy", "numba": "numba", "polars": "polars", "altair": "altair",
    "vl-convert-python": "vl-convert-python", "ipywidgets": "ipywidgets", "anywidget": "anywidget",
    "tqdm": "tqdm", "cbor2": "cbor2", "xxhash": "python-xxhash", "blake3": "blake3",
    "msgpack": "msgpack-python", "redis": "redis-py", "hiredis": "hiredis", "dask[distributed]": "distributed",
    "pytest": "pytest", "hypothesis": "hypothesis", "nbmake": "nbmake", "jupyterlab": "jupyterlab",
    "pyyaml": "pyyaml", "ruff": "ruff", "voila": "voila", "playwright": "playwright",
}
#: conda-only additions: the Redis server the tests and ``kvlab events replay --backend redis://`` talk to.
CONDA_ONLY = {"redis-server"}


def split(requirement: str) -> tuple[str, str]:
    """``"redis>=5.0"`` → ``("redis", ">=5.0")``; extras stay with the name (``"dask[distributed]"``)."""
    name = re.match(r"[A-Za-z0-9._-]+(\[[A-Za-z0-9,._-]+\])?", requirement).group(0)
    return name, requirement[len(name):]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_pypi_requirement_has_its_conda_forge_name() -> None:
    project = pyproject()
    names = {split(r)[0].lower() for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]}
    assert sorted(names - set(CONDA_NAMES)) == []  # look up the conda-forge name, add it above
    assert sorted(set(CONDA_NAMES) - names) == []  # a dependency dropped from pyproject.toml


def test_environment_yml_mirrors_pyproject() -> None:
    """Issue 14 item 21: xxhash and msgpack were listed under their PyPI names, which conda-forge
    does not resolve to the Python packages (the file would not solve)."""
    project = pyproject()
    wanted = set()
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        name, version = split(requirement)
        wanted.add(CONDA_NAMES[name.lower()] + version)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [d for d in env["dependencies"] if isinstance(d, dict)]
    assert f"python{project['requires-python']}" in conda
    assert set(conda) - {f"python{project['requires-python']}", "pip"} == wanted | CONDA_ONLY
    assert {"python-xxhash>=3.4", "msgpack-python>=1.0", "redis-py>=5.0"} <= set(conda)
    assert pip == [{"pip": ["-e .[dev]"]}]
    assert env["channels"] == ["conda-forge", "nodefaults"]
