"""The layout (README, "Architecture"): imports point one way, between the project's packages and between the layers
of ``tasks``, and no module of the project imports itself back through any chain of imports.

Read from the source with ``ast``: every ``import`` and ``from … import`` of every module, at any depth (inside a
function or under ``TYPE_CHECKING`` too). A string reference (a Django foreign key by label, a Celery task by name)
is not an import and is not counted."""

import ast
import re
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tables(readme: str) -> list[list[tuple[list[str], list[str]]]]:
    """The tables between the README's layer markers: per row, the names in its first cell and in its last."""
    block = readme.split("<!-- layers:begin -->", 1)[1].split("<!-- layers:end -->", 1)[0]
    tables: list[list[tuple[list[str], list[str]]]] = []
    for chunk in re.split(r"\n\s*\n", block):
        rows = [line for line in chunk.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
        if rows:
            cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
            tables.append([(re.findall(r"`([^`]+)`", c[0]), re.findall(r"`([^`]+)`", c[-1])) for c in cells])
    return tables


def _layer(name: str) -> str:
    """A layer of tasks as the README's table names it: ``people/`` is people; the model modules are ``models``;
    the app's shell modules are ``shell``."""
    name = name.rstrip("/")
    return (
        "models"
        if name in ("models.py", "querysets.py", "rows.py")
        else "shell"
        if "." in name or name == "management"
        else name
    )


_PACKAGES, _LAYERS = _tables((ROOT / "README.md").read_text())
# Each package of the project and the project packages it may import besides itself: the README's table.
MAY_IMPORT: dict[str, frozenset[str]] = {name: frozenset(imports) for names, imports in _PACKAGES for name in names}
# The layers of ``tasks`` and the layers each may import besides itself: the README's second table. ``models`` is
# tasks/models.py, tasks/querysets.py and tasks/rows.py; the app's shell (jobs.py, admin.py, apps.py, management/)
# may import every layer.
TASK_LAYERS: dict[str, frozenset[str]] = {_layer(names[0]): frozenset(imports) for names, imports in _LAYERS}
TASK_LAYERS["shell"] = frozenset(TASK_LAYERS) - {"shell"}
MODEL_LAYER = frozenset({"models", "querysets", "rows"})


def project_packages() -> frozenset[str]:
    return frozenset(p.parent.name for p in ROOT.glob("*/__init__.py")) | frozenset(MAY_IMPORT)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[:2] == ["client", "reckon_client"]:
        parts = parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The imports under ``if TYPE_CHECKING:``: read by the type checker, never run."""
    guarded: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            guarded.update(n for stmt in node.body for n in ast.walk(stmt))
    return guarded


def imported_modules(
    source: str, filename: str = "<source>", importer: str = "", *, runtime: bool = False
) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in ``source``; a relative import is resolved against ``importer``.
    ``runtime``: only the imports that run (not those under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(source, filename)
    skipped = _type_checking_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = importer.split(".")[: -node.level] if importer else []
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                # ``from tasks.core import errors`` imports the module tasks.core.errors; ``from x import name``: x
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name


def imported_packages(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``source``."""
    for line, name in imported_modules(source, filename):
        yield line, name.split(".")[0]


def layer_of(module: str) -> str | None:
    """The layer of a module of ``tasks`` (None for anything else)."""
    parts = module.split(".")
    if parts[0] != "tasks" or len(parts) == 1:
        return None
    if parts[1] in TASK_LAYERS:
        return parts[1]
    return "models" if parts[1] in MODEL_LAYER else "shell"


def violations(package: str, path: Path, source: str, project: frozenset[str]) -> list[str]:
    allowed = MAY_IMPORT[package] | {package}
    where = path.relative_to(ROOT) if path.is_absolute() else path
    return [
        f"{where}:{line} imports {name}"
        for line, name in imported_packages(source, str(path))
        if name in project and name not in allowed
    ]


def layer_violations(module: str, path: Path, source: str) -> list[str]:
    own = layer_of(module)
    if own is None:
        return []
    allowed = TASK_LAYERS[own] | {own}
    where = path.relative_to(ROOT) if path.is_absolute() else path
    found = []
    for line, name in imported_modules(source, str(path), module):
        layer = layer_of(_existing(name))
        if layer is not None and layer not in allowed:
            found.append(f"{where}:{line} ({own}) imports {name} ({layer})")
    return found


def _existing(name: str) -> str:
    """``name`` or, if it names something inside a module (``tasks.models.Task``), that module."""
    parts = name.split(".")
    while parts:
        candidate = ROOT.joinpath(*parts)
        if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
            return ".".join(parts)
        parts.pop()
    return name


def sources() -> Iterator[tuple[Path, str]]:
    for path in sorted(ROOT.glob("*/**/*.py")):
        if path.parts[len(ROOT.parts)] in MAY_IMPORT and "migrations" not in path.parts:
            yield path, module_name(path)


def import_graph() -> dict[str, set[str]]:
    """Every module of the project and the modules of the project it imports."""
    modules = dict((name, path) for path, name in sources())
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, imported in imported_modules(path.read_text(), str(path), name, runtime=True):
            target = _existing(imported) if imported.split(".")[0] in MAY_IMPORT else ""
            if target in graph and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def test_the_readme_draws_every_package_and_layer_without_a_circle() -> None:
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert set(MAY_IMPORT) >= on_disk, f"packages missing from the README's table: {sorted(on_disk - set(MAY_IMPORT))}"
    layers = {p.parent.name for p in (ROOT / "tasks").glob("*/__init__.py")} - {"migrations", "management"}
    assert set(TASK_LAYERS) == layers | {"models", "shell"}, sorted(TASK_LAYERS)
    assert all(imports <= set(MAY_IMPORT) for imports in MAY_IMPORT.values())
    TopologicalSorter(MAY_IMPORT).prepare()
    TopologicalSorter(TASK_LAYERS).prepare()


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_what_lies_below_it(package: str) -> None:
    project = project_packages()
    files = [path for path, _ in sources() if path.parts[len(ROOT.parts)] == package]
    assert files, f"no source found under {package}/"
    found = [v for path in files for v in violations(package, path, path.read_text(), project)]
    assert not found, "imports against the layout (README, Architecture): " + "; ".join(found)


def test_each_layer_of_tasks_imports_only_the_layers_below_it() -> None:
    found = [v for path, name in sources() for v in layer_violations(name, path, path.read_text())]
    assert not found, "imports against the layers of tasks (README, Architecture): " + "; ".join(found)


def test_no_module_imports_itself_back() -> None:
    """No chain of imports that run leads from a module back to itself (an import under ``if TYPE_CHECKING:`` is
    for the type checker only; the layer checks above count it all the same)."""
    try:
        TopologicalSorter(import_graph()).prepare()
    except CycleError as circle:
        pytest.fail("an import circle: " + " -> ".join(circle.args[1]))


@pytest.mark.parametrize(
    ("package", "source", "bad"),
    [
        ("tasks", "from reference import migrate_project\n", "reference"),
        ("tasks", "def f():\n    import harness.killmatrix\n", "harness"),
        (
            "leases",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from console import settings\n",
            "console",
        ),
        ("retention", "import api.views\n", "api"),
        ("leases", "from tasks.models import Task\n", "tasks"),
        ("audit", "from leases.models import Lease\n", "leases"),
        ("api", "from hooks.services import webhook_list\n", "hooks"),
    ],
)
def test_the_check_sees_an_import_against_the_layout(package: str, source: str, bad: str) -> None:
    found = violations(package, Path(f"{package}/example.py"), source, project_packages())
    assert len(found) == 1 and found[0].endswith(f"imports {bad}")


@pytest.mark.parametrize(
    ("module", "source", "bad"),
    [
        ("tasks.core.example", "from tasks.models import Task\n", "models"),
        ("tasks.decide.example", "def f():\n    from tasks.engine.cas import compare_and_set\n", "engine"),
        ("tasks.engine.example", "from tasks.people import takeover\n", "people"),
        ("tasks.engine.example", "from tasks.jobs import drive_task\n", "shell"),
        ("tasks.querysets", "from tasks.access.permissions import can_view\n", "access"),
        ("tasks.reads.example", "from ..people.bulk import bulk_run_apply\n", "people"),
    ],
)
def test_the_check_sees_an_import_against_the_layers(module: str, source: str, bad: str) -> None:
    path = Path(module.replace(".", "/") + ".py")
    found = layer_violations(module, path, source)
    assert len(found) == 1 and found[0].endswith(f"({bad})"), found


def test_the_check_sees_a_circle() -> None:
    """A planted import back (the engine importing people, which imports the engine) is a circle the test names."""
    planted = {name: set(targets) for name, targets in import_graph().items()}
    planted["tasks.engine.cas"].add("tasks.people.takeover")
    with pytest.raises(CycleError):
        TopologicalSorter(planted).prepare()


def test_the_check_lets_through_what_the_layout_allows() -> None:
    source = "import json\nfrom django.db import models\nfrom leases import clock\nfrom . import errors\n"
    assert violations("tasks", Path("tasks/example.py"), source, project_packages()) == []
    allowed = "from tasks.decide import decisions\n"
    assert layer_violations("tasks.engine.example", Path("tasks/engine/example.py"), allowed) == []


# A client extra's own module imports the library the extra installs (client/pyproject.toml), and no other does.
CLIENT_EXTRAS = {"client/reckon_client/connectors/postgres.py": {"psycopg"}}


def test_the_client_and_the_examples_import_nothing_of_the_server() -> None:
    """An agent author installs client/ alone (httpx its only dependency) and copies examples/: neither may need
    Django or any package of the server (psycopg only in the PostgreSQL connector, the extra ``postgres``)."""
    forbidden = (project_packages() - {"client", "examples"}) | {"django", "ninja", "celery", "psycopg"}
    files = sorted((ROOT / "client" / "reckon_client").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    assert files, "no client source found"
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in files
        for line, name in imported_packages(path.read_text(), str(path))
        if name in forbidden - CLIENT_EXTRAS.get(str(path.relative_to(ROOT)), set())
    ]
    assert not found, "the client must stand alone: " + "; ".join(found)
