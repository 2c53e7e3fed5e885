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
                  "asyncckpt.checkpointer", "asyncckpt.costs", "asyncckpt.planning")


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


ROOT = PACKAGE.parent


def every_module() -> dict[str, Path]:
    """Each module of ``asyncckpt`` and ``schedules`` by its dotted name (a package by its own)."""
    paths = {}
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "schedules").rglob("*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return paths


def _resolved(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ``modules`` that ``name`` (a module or a name in one) is read from."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, modules: dict[str, Path], *, typing: bool) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports, at its top level and in its
    functions alike (a function's import runs when it is called); with ``typing``, also those
    imported under ``if TYPE_CHECKING`` for annotations alone. ``from package import name``
    counts the submodule where ``name`` is one, else the package, whose ``__init__`` holds it;
    a package is not counted for being the parent of a module imported from it."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]  # a module's package; an __init__'s is its own folder
    found: set[str | None] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while pending:
        node = pending.pop()
        if (not typing and isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test)):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(_resolved(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else _resolved(source, modules))
        else:
            pending.extend(ast.iter_child_nodes(node))
    return {m for m in found if m is not None and m != name}


def import_graph(*, typing: bool) -> dict[str, set[str]]:
    modules = every_module()
    return {name: imports_of(name, path, modules, typing=typing)
            for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for imported in sorted(graph[name]):
            if imported not in index:
                visit(imported)
                low[name] = min(low[name], low[imported])
            elif imported in stack:
                low[name] = min(low[name], index[imported])
        if low[name] == index[name]:
            component = []
            while not component or component[-1] != name:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_circle():
    """No module imports, at any depth, a module that imports it back through any chain.
    Imports under ``if TYPE_CHECKING`` name types for annotations and load nothing; they are
    held to the layers below, not to this rule."""
    assert circles(import_graph(typing=False)) == []


#: The layers of the package, lowest first: a module imports from its own layer or below,
#: never above (a module is in the layer of the longest prefix that names it)
LAYERS = (
    ("schedules",),
    ("asyncckpt._version", "asyncckpt.errors", "asyncckpt.stats", "asyncckpt.compression",
     "asyncckpt._lifetime"),
    ("asyncckpt._memory", "asyncckpt.storage", "asyncckpt.devices"),
    ("asyncckpt.checkpoint",),
    ("asyncckpt._execution",),
    ("asyncckpt._planning",),
    ("asyncckpt._tuning",),
    ("asyncckpt.costs", "asyncckpt.planning", "asyncckpt._build", "asyncckpt._runs",
     "asyncckpt.checkpointer"),
    ("asyncckpt", "asyncckpt.testing", "asyncckpt.cli", "asyncckpt.__main__"),
    ("asyncckpt.compat", "asyncckpt.torch", "asyncckpt.jax"),
)


def layer_of(name: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix naming module ``name``."""
    named = [(len(prefix), i) for i, layer in enumerate(LAYERS) for prefix in layer
             if name == prefix or name.startswith(f"{prefix}.")]
    assert named, f"{name} is in no layer of LAYERS"
    return max(named)[1]


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    up = sorted(f"{name} -> {imported}" for name, imported_ in import_graph(typing=True).items()
                for imported in imported_ if layer_of(imported) > layer_of(name))
    assert up == []


#: What ``_planning`` imports of execution's rooms today: the planner still holds Level-2 and
#: its bounded calls (``plan.py``), the budget charges a device's digest words
#: (``budget.py``), and the default bound counts the kept files in RAM (``host_bound.py``)
PLANNING_REACHES_DOWN = {
    "asyncckpt._planning.budget": {"asyncckpt._execution.device_link"},
    "asyncckpt._planning.host_bound": {"asyncckpt.storage.kept"},
    "asyncckpt._planning.plan": {"asyncckpt._execution.bounded", "asyncckpt._execution.decisions",
                                 "asyncckpt.storage"},
}


def test_planning_imports_nothing_of_execution_storage_or_devices():
    """Besides :data:`PLANNING_REACHES_DOWN`, which may only shrink."""
    rooms = ("asyncckpt._execution", "asyncckpt.storage", "asyncckpt.devices")
    reached = {name: {m for m in imported if m.startswith(rooms)}
               for name, imported in import_graph(typing=True).items()
               if name.startswith("asyncckpt._planning")}
    reached = {name: imported for name, imported in reached.items() if imported}
    for name, imported in reached.items():
        assert imported <= PLANNING_REACHES_DOWN.get(name, set()), (name, imported)


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


def named_on_the_architecture_page() -> set[Path]:
    """The files docs/architecture.md names in backquotes: a path relative to the folder its
    last heading named, to the repository or to ``asyncckpt/`` (the first that exists), or a
    dotted module path (``asyncckpt.storage.base``); a folder (``storage/``) names its
    ``__init__.py``."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules = every_module()
    folder, named = ROOT, set()
    for line in page.splitlines():
        tokens = re.findall(r"`([\w./-]+(?:\.py|/))`", line)
        if line.startswith("#") and tokens:
            folder = ROOT / tokens[0]
        for token in tokens:
            path = next((base / token for base in (folder, ROOT, PACKAGE)
                         if (base / token).exists()), None)
            if path is not None:
                named.add(path / "__init__.py" if path.is_dir() else path)
        for dotted in re.findall(r"`((?:asyncckpt|schedules)(?:\.\w+)+)`", line):
            if dotted in modules:
                named.add(modules[dotted])
    return named


def test_the_architecture_page_names_every_module():
    """Every module of ``asyncckpt/`` and ``schedules/`` has its line on the page."""
    named = named_on_the_architecture_page()
    unnamed = sorted(str(path.relative_to(ROOT)) for path in every_module().values()
                     if path not in named)
    assert unnamed == []
