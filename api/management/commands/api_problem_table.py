"""Print docs/api.md's table of problem types as the code makes it (api/errors.py), or, with ``--write``, put it
between the document's markers. tests/test_problem_table.py fails while the two differ."""

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from api.errors import problem_table

BEGIN, END = "<!-- problems:begin -->\n", "<!-- problems:end -->"


def with_table(document: str, table: str) -> str:
    """``document`` with ``table`` between its markers."""
    head, rest = document.split(BEGIN, 1)
    return head + BEGIN + table + END + rest.split(END, 1)[1]


class Command(BaseCommand):
    help = "Print (or --write into docs/api.md) the table of the API's problem types, made from api/errors.py."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--write", action="store_true", help="rewrite the table in docs/api.md")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["write"]:
            self.stdout.write(problem_table(), ending="")
            return
        path = Path(settings.BASE_DIR) / "docs" / "api.md"
        path.write_text(with_table(path.read_text(), problem_table()))
        self.stdout.write(f"wrote the table of problem types into {path}")
