"""docs/api.md's table of problem types is the code's (api/errors.py): the text between its ``problems`` markers is
what ``problem_table()`` makes, and every named refusal an agent can meet has its status there — none falls through
to the default unseen (``node_not_ready`` once did, and the docs' table did not name it)."""

import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

from api.errors import STATUS_OF, problem_table
from api.http import ApiError
from api.management.commands.api_problem_table import BEGIN, END, with_table
from audit.errors import Refused

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
# Codes no agent meets on the API: the bases of families (never raised themselves) and the console's own refusals.
NOT_ON_THE_API = {
    "refused",
    "task_error",
    "api_error",
    "approval_refused",
    "webhook_error",
    "bulk_refused",
    "grant_refused",
    "role_refused",
    "note_refused",
    "takeover_refused",
}


def test_the_docs_table_of_problem_types_is_the_one_the_code_makes() -> None:
    document = DOC.read_text()
    assert document.count(BEGIN) == document.count(END) == 1, "docs/api.md lost its problems markers"
    assert with_table(document, problem_table()) == document, (
        "docs/api.md's table of problem types differs from api/errors.py: run ./dev manage api_problem_table --write"
    )


def _subclasses(cls: type[Exception]) -> Iterator[type[Exception]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_named_refusal_an_agent_can_meet_has_its_status_in_the_table() -> None:
    for package in ("audit", "leases", "tasks", "retention", "api", "hooks"):
        for found in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if ".migrations" not in found.name:
                importlib.import_module(found.name)
    codes = {str(getattr(cls, "code", "")) for cls in [Refused, *_subclasses(Refused), *_subclasses(ApiError)]}
    unmapped = sorted(codes - set(STATUS_OF) - NOT_ON_THE_API)
    assert not unmapped, f"refusals with no status of their own in api/errors.py STATUS_OF: {unmapped}"
    assert "node_not_ready" in problem_table()


def test_the_table_names_each_code_once_under_its_status() -> None:
    table = problem_table()
    for code, status in STATUS_OF.items():
        [row] = [line for line in table.splitlines() if f"`{code}`" in line.split("|")[2]]
        assert row.startswith(f"| {status} |"), (code, row)
