"""Every Python example of README.md and docs/*.md runs as written, each in a fresh process.

A block runs unless the page says why it does not: ``<!-- not-run: reason -->`` on the last
line before its fence. ``<!-- continues -->`` there runs it after the page's previous block, in
the same process (a page that builds an example up in steps). A block that needs an optional
extra (an ``import`` of it, or a ``<!-- requires: devito -->`` line before its fence) is
skipped, naming the extra, where that extra is not installed.

The guide pages speak in the present tense: none holds a date or a commit hash, which belong to
CHANGELOG.md and the measured pages (benchmarks.md, results.md, measurements.md).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: the module each extra brings, as a block imports it
EXTRAS = {"torch": "torch", "jax": "jax", "cupy": "gpu", "mpi4py": "mpi", "devito": "devito",
          "examples": "devito", "blosc2": "compression", "zfpy": "compression"}
IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:asyncckpt\.)?(\w+)", re.M)
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->")
REQUIRES = re.compile(r"<!--\s*requires:\s*(.*?)\s*-->")
CONTINUES = re.compile(r"<!--\s*continues\s*-->")
#: seconds one example may take; each is small, the slowest compiles a Devito operator
BLOCK_TIMEOUT_S = 100
#: examples that must run where every extra is installed
AT_LEAST = 25


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    not_run: str | None  # the reason given, where the page marks it not run
    requires: tuple[str, ...]  # the modules it needs beyond the core

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().rpartition("\n")[2]
        not_run = NOT_RUN.search(before)
        named = REQUIRES.search(before)
        code = match.group(1)
        modules = {m for m in IMPORT.findall(code) if m in EXTRAS}
        if named:
            modules |= {m.strip() for m in named.group(1).split(",")}
        if CONTINUES.search(before):
            assert found, f"{page.name}: its first block continues nothing"
            code = found[-1].code + code
            modules |= set(found[-1].requires)
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, code,
                           not_run.group(1) if not_run else None, tuple(sorted(modules))))
    return found


ALL = [block for page in PAGES for block in blocks(page)]


def missing(block: Block) -> list[str]:
    return [m for m in block.requires if importlib.util.find_spec(m) is None]


def test_every_example_is_found_and_enough_of_them_run() -> None:
    assert len(PAGES) > 10
    runnable = [b for b in ALL if b.not_run is None]
    assert len(runnable) >= AT_LEAST, [b.name for b in ALL if b.not_run]
    for block in ALL:
        assert block.not_run != "", f"{block.name}: a not-run mark gives its reason"
        unknown = set(block.requires) - set(EXTRAS)
        assert not unknown, f"{block.name}: requires names {unknown}, not one of {set(EXTRAS)}"


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 20)
@pytest.mark.parametrize("block", ALL, ids=lambda b: b.name)
def test_the_example_runs(block: Block, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"marked not run: {block.not_run}")
    absent = missing(block)
    if absent:
        extras = sorted({EXTRAS[m] for m in absent})
        pytest.skip(f"needs {', '.join(absent)} (pip install asyncckpt[{','.join(extras)}])")
    script = tmp_path / "example.py"
    script.write_text(block.code)
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]  # this checkout's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.name} ran past {BLOCK_TIMEOUT_S} s:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, (
        f"{block.name} failed (exit {done.returncode}); mark it "
        f"'<!-- not-run: reason -->' only where it cannot run:\n{done.stdout}\n{done.stderr}")


def test_a_failing_example_fails_the_test(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nprint(undefined)\n```\n\n<!-- not-run: a sketch -->\n"
                    "```python\nmore(undefined)\n```\n<!-- requires: devito -->\n```python\n"
                    "import torch\n```\n<!-- continues -->\n```python\nx = 1\n```\n")
    found = blocks(page)
    assert [(b.line, b.not_run, b.requires) for b in found] == [
        (3, None, ()), (8, "a sketch", ()), (12, None, ("devito", "torch")),
        (16, None, ("devito", "torch"))]
    assert found[3].code == "import torch\nx = 1\n"
    done = subprocess.run([sys.executable, "-c", found[0].code], capture_output=True, text=True)
    assert done.returncode != 0 and "NameError" in done.stderr



#: pages of measurements, which carry the date, commit and machine of each figure
MEASURED = {"CHANGELOG.md", "benchmarks.md", "results.md", "measurements.md"}
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


#: a link into a measured page may name its dated heading: the reader sees the link's text
MEASURED_LINK = re.compile(r"\]\((?:docs/)?(?:benchmarks|results|measurements)\.md#[^)]*\)"
                           r"|^\[[^\]]+\]:\s*\S*(?:benchmarks|results|measurements)\.md#\S*",
                           re.M)


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in MEASURED],
                         ids=lambda p: p.name)
def test_a_guide_page_holds_no_date_or_commit(page: Path) -> None:
    text = MEASURED_LINK.sub("", page.read_text())
    found = [(text.count("\n", 0, m.start()) + 1, m.group()) for m in
             [*DATE.finditer(text), *COMMIT.finditer(text)]]
    assert not found, (f"{page.name}: dates and commits belong in CHANGELOG.md or "
                       f"docs/benchmarks.md, not a guide page: {sorted(found)}")


#: a page named in plain text ("see docs/model.md"), where the site needs a link to it
PLAIN_MENTION = re.compile(r"(?<!\]\()(?<!\[)\bdocs/[a-z_]+\.md")


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_a_page_named_in_the_text_is_a_link(page: Path) -> None:
    # 52 plain-text mentions of docs/x.md were dead ends on the site
    prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    found = PLAIN_MENTION.findall(prose)
    assert not found, f"{page.name} names {found} in plain text: write [x.md](x.md)"


BLOCKER = '''
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    """The docs extra alone: none of the frameworks of the other extras is installed."""
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"torch", "jax", "jaxlib", "cupy", "devito", "mpi4py"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())
'''


@pytest.mark.timeout(600)
def test_the_site_builds_with_the_docs_extra_alone(tmp_path: Path) -> None:
    # conf.py imported asyncckpt.torch and asyncckpt.jax: ModuleNotFoundError without torch
    pytest.importorskip("sphinx")
    pytest.importorskip("pydata_sphinx_theme")
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "path"), "PYTHON": sys.executable}
    done = subprocess.run([str(ROOT / "scripts" / "build_docs.sh"), str(tmp_path / "site")],
                          env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    page = tmp_path / "site" / "api" / "generated" / "asyncckpt.torch.checkpoint_scan.html"
    assert "memory_budget" in page.read_text()
