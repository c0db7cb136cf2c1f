"""environment.yml must mirror pyproject.toml (the one source of dependencies)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_environment_yml_mirrors_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [d for d in env["dependencies"] if isinstance(d, dict)]
    assert f"python{project['requires-python']}" in conda
    assert set(conda) - {f"python{project['requires-python']}", "pip"} == wanted
    assert pip == [{"pip": ["-e .[dev]"]}]
    assert env["channels"] == ["conda-forge", "nodefaults"]
