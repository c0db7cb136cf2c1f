"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) <= 12
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)  # noqa: S102 - our own README
    assert round(namespace["result"].summary.block_hit_ratio, 4) == 0.2116
    assert namespace["curve"].height == 4
    assert "0.2116" in capsys.readouterr().out
