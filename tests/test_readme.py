"""The README's example runs as written."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has a python example"
    exec(compile(blocks[0], str(README), "exec"), {})  # noqa: S102 - our own README
    printed = capsys.readouterr().out.split()
    assert float(printed[0]) >= 0.999  # recompute factor of a real run
