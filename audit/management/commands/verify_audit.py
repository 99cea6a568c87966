from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.account_changes import account_changes_fold_all
from audit.services import verify_audit


class Command(BaseCommand):
    help = (
        "Check the audit chain end to end, and against the newest signed checkpoint of its head outside the database "
        "(RECKON_ANCHOR_PATH); report the first broken link. Account changes the database captured are put on the "
        "chain first."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        folded = account_changes_fold_all()
        if folded:
            self.stdout.write(f"account changes: {folded} captured by the database, now on the audit chain")
        verdict = verify_audit()
        if verdict.account_changes_pending:
            self.stdout.write(
                f"account changes: {verdict.account_changes_pending} captured since, not on the chain yet"
            )
        if verdict.anchor:
            self.stdout.write(f"anchors: {verdict.anchor}")
        if verdict.problem:
            if verdict.broken_at is None:  # not a link: the append-only triggers or the anchor file
                self.stdout.write(f"verify_audit: {verdict.checked} events, chain intact; PROBLEM: {verdict.problem}")
                raise CommandError(verdict.problem)
            self.stdout.write(f"verify_audit: {verdict.checked} events read; FIRST BROKEN LINK: {verdict.problem}")
            raise CommandError(f"audit chain broken at #{verdict.broken_at}")
        self.stdout.write(f"verify_audit: {verdict.checked} events, chain intact")
