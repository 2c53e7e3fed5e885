"""The rules of docs/architecture.md, checked on the source: which room may import which."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "asyncckpt"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute (relative imports resolved), at any depth."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]  # a module's package; an __init__'s is its own folder, the same
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def modules_under(room: str) -> list[Path]:
    return sorted((PACKAGE / room).rglob("*.py"))


ABOVE_PLANNING = ("asyncckpt._tuning", "asyncckpt._build", "asyncckpt._runs",
                  "asyncckpt.checkpointer")


def test_the_rooms_exist():
    for room in ("_planning", "_tuning", "_execution", "_memory"):
        assert modules_under(room), room


@pytest.mark.parametrize("path", modules_under("_execution"), ids=lambda p: p.name)
def test_execution_never_imports_planning_or_tuning(path):
    bad = [m for m in imported_modules(path)
           if m.startswith(("asyncckpt._planning",) + ABOVE_PLANNING)]
    assert not bad


@pytest.mark.parametrize("path", modules_under("_planning"), ids=lambda p: p.name)
def test_deciding_never_imports_learning(path):
    assert not [m for m in imported_modules(path) if m.startswith(ABOVE_PLANNING)]


@pytest.mark.parametrize("path", modules_under("_tuning"), ids=lambda p: p.name)
def test_learning_never_imports_the_assembly_or_the_facade(path):
    assert not [m for m in imported_modules(path) if m.startswith(ABOVE_PLANNING[1:])]


@pytest.mark.parametrize("room", ["_memory", "storage", "devices"])
def test_the_lower_rooms_import_neither_planning_nor_execution(room):
    for path in modules_under(room):
        bad = [m for m in imported_modules(path)
               if m.startswith(("asyncckpt._planning", "asyncckpt._execution") + ABOVE_PLANNING)]
        assert not bad, (path, bad)


@pytest.mark.parametrize("adapter", ["compat", "torch", "jax"])
def test_the_adapters_import_nothing_private(adapter):
    for path in modules_under(adapter):
        private = [m for m in imported_modules(path)
                   if m.startswith("asyncckpt.") and any(
                       part.startswith("_") and not part.startswith("__")
                       for part in m.split(".")[1:-1] if not m.startswith(f"asyncckpt.{adapter}"))]
        assert not private, (path, private)


def test_no_module_is_too_long():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    schedules = PACKAGE.parent / "schedules"
    long.update({str(p.relative_to(PACKAGE.parent)): n for p in schedules.rglob("*.py")
                 if (n := len(p.read_text().splitlines())) > 500})
    assert not long


def test_no_module_holds_too_many_characters():
    """Lines alone let a module pack its code to fit: characters count what there is to read."""
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text())) > 16_000}
    assert not long, long


def test_no_class_is_too_long():
    long = {}
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "schedules").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 300:
                long[f"{path.relative_to(PACKAGE.parent)}:{node.name}"] = \
                    node.end_lineno - node.lineno + 1
    assert not long


def test_no_type_ignore_in_the_runtime():
    assert not [p for p in PACKAGE.rglob("*.py") if "type: ignore" in p.read_text()]


def test_the_facade_stays_small():
    source = (PACKAGE / "checkpointer.py").read_text()
    [facade] = [node for node in ast.parse(source).body
                if isinstance(node, ast.ClassDef) and node.name == "AsyncCheckpointer"]
    assert facade.end_lineno - facade.lineno + 1 < 250


def top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports when it is loaded (its top level, outside
    ``if TYPE_CHECKING``), its own packages left out (a parent is loaded first, not a circle)."""
    root = PACKAGE.parent
    parts = list(path.relative_to(root).with_suffix("").parts)
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    package = parts[:-1]
    found = set()
    pending = list(ast.parse(path.read_text(), str(path)).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))  # a function's imports run when called
    return {m for m in found if m in modules and not f"{name}.".startswith(f"{m}.")}


def test_no_import_circle():
    root = PACKAGE.parent
    paths = {}
    for path in [*PACKAGE.rglob("*.py"), *(root / "schedules").rglob("*.py")]:
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: top_level_imports(path, set(paths)) for name, path in paths.items()}
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for imported in sorted(graph[name]):
            assert state.get(imported) != "open", " -> ".join(
                trail[trail.index(imported):] + [imported]) if imported in trail else imported
            if imported not in state:
                visit(imported, trail + [imported])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_every_path_the_architecture_page_names_exists():
    """docs/architecture.md names files and folders in backquotes, relative to the repository,
    to ``asyncckpt/``, or to the folder its last heading named."""
    root = PACKAGE.parent
    page = (root / "docs" / "architecture.md").read_text()
    folder, named = root, 0
    for line in page.splitlines():
        tokens = re.findall(r"`([\w./-]+(?:\.py|/))`", line)
        if line.startswith("#") and tokens:
            folder = root / tokens[0]
        for token in tokens:
            named += 1
            where = [root / token, PACKAGE / token, folder / token]
            assert any(path.exists() for path in where), (token, line)
    assert named > 40
