"""The layout (STYLE.md "Layout"): imports point one way, ``retention → tasks → leases → audit``. The domain never
imports ``console``, ``api``, ``agents`` or ``harness`` (nor the tests); ``audit`` imports no app of the project.
Read from the source with ``ast``: every ``import`` and ``from … import`` of every module, at any depth (inside a
function or under ``TYPE_CHECKING`` too)."""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each domain package and the project packages it may import besides itself.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "audit": frozenset(),
    "leases": frozenset({"audit"}),
    "tasks": frozenset({"leases", "audit"}),
    "retention": frozenset({"tasks", "leases", "audit"}),
}
NEVER_PRESENT = frozenset({"api"})  # a project package that may not exist yet


def project_packages() -> frozenset[str]:
    return frozenset(p.parent.name for p in ROOT.glob("*/__init__.py")) | NEVER_PRESENT


def imported_packages(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``source``."""
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def violations(package: str, path: Path, source: str, project: frozenset[str]) -> list[str]:
    allowed = MAY_IMPORT[package] | {package}
    return [
        f"{path.relative_to(ROOT) if path.is_absolute() else path}:{line} imports {name}"
        for line, name in imported_packages(source, str(path))
        if name in project and name not in allowed
    ]


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_the_domain_imports_only_what_lies_below_it(package: str) -> None:
    project = project_packages()
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no source found under {package}/"
    found = [v for path in files for v in violations(package, path, path.read_text(), project)]
    assert not found, "imports against the layout (STYLE.md): " + "; ".join(found)


@pytest.mark.parametrize(
    ("package", "source", "bad"),
    [
        ("tasks", "from agents import migrate_project\n", "agents"),
        ("tasks", "def f():\n    import harness.killmatrix\n", "harness"),
        (
            "leases",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from console import settings\n",
            "console",
        ),
        ("retention", "import api.views\n", "api"),
        ("leases", "from tasks.models import Task\n", "tasks"),
        ("audit", "from leases.models import Lease\n", "leases"),
    ],
)
def test_the_check_sees_an_import_against_the_layout(package: str, source: str, bad: str) -> None:
    found = violations(package, Path(f"{package}/example.py"), source, project_packages())
    assert len(found) == 1 and found[0].endswith(f"imports {bad}")


def test_the_check_lets_through_what_the_layout_allows() -> None:
    source = "import json\nfrom django.db import models\nfrom leases import clock\nfrom . import errors\n"
    assert violations("tasks", Path("tasks/example.py"), source, project_packages()) == []


def test_the_client_and_the_examples_import_nothing_of_the_server() -> None:
    """An agent author installs client/ alone (httpx its only dependency) and copies examples/: neither may need
    Django or any package of the server."""
    forbidden = project_packages() | {"django", "ninja", "celery", "psycopg"}
    files = sorted((ROOT / "client" / "reckon_client").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    assert files, "no client source found"
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in files
        for line, name in imported_packages(path.read_text(), str(path))
        if name in forbidden
    ]
    assert not found, "the client must stand alone: " + "; ".join(found)
