from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.services import verify_audit


class Command(BaseCommand):
    help = (
        "Check the audit chain end to end, and against the newest signed checkpoint of its head outside the database "
        "(RECKON_ANCHOR_PATH); report the first broken link."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        verdict = verify_audit()
        if verdict.anchor:
            self.stdout.write(f"anchors: {verdict.anchor}")
        if verdict.problem:
            if verdict.broken_at is None:  # not a link: the append-only triggers or the anchor file
                self.stdout.write(f"verify_audit: {verdict.checked} events, chain intact; PROBLEM: {verdict.problem}")
                raise CommandError(verdict.problem)
            self.stdout.write(f"verify_audit: {verdict.checked} events read; FIRST BROKEN LINK: {verdict.problem}")
            raise CommandError(f"audit chain broken at #{verdict.broken_at}")
        self.stdout.write(f"verify_audit: {verdict.checked} events, chain intact")
