"""environment.yml must mirror pyproject.toml (the one source of dependencies)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
#: PyPI names that conda-forge spells differently (there, ``redis`` is the server).
CONDA_NAMES = {"redis": "redis-py"}
#: conda-only additions: the Redis server the tests and ``kvlab events replay --backend redis://`` talk to.
CONDA_ONLY = {"redis-server"}


def conda_spelling(requirement: str) -> str:
    """``redis>=5.0`` → ``redis-py>=5.0``; other requirements unchanged."""
    name = requirement.split(">")[0].split("=")[0].split("<")[0]
    return CONDA_NAMES.get(name, name) + requirement[len(name):]


def test_environment_yml_mirrors_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {conda_spelling(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [d for d in env["dependencies"] if isinstance(d, dict)]
    assert f"python{project['requires-python']}" in conda
    assert set(conda) - {f"python{project['requires-python']}", "pip"} == wanted | CONDA_ONLY
    assert pip == [{"pip": ["-e .[dev]"]}]
    assert env["channels"] == ["conda-forge", "nodefaults"]
