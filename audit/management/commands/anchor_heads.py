from typing import Any

from django.core.management.base import BaseCommand

from audit.anchors import anchor_heads, anchor_path


class Command(BaseCommand):
    help = (
        "Append one signed checkpoint of the audit chain's head and every task's log head to the anchor file "
        "(RECKON_ANCHOR_PATH, HMAC under RECKON_ANCHOR_KEY). The beat does it every RECKON_ANCHOR_SECONDS."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        checkpoint = anchor_heads()
        if checkpoint is None:
            self.stdout.write("anchor_heads: not anchored: RECKON_ANCHOR_KEY is not set")
            return
        tasks = checkpoint.sections.get("tasks", {})
        heads = len(tasks.get("heads", {})) if isinstance(tasks, dict) else 0
        self.stdout.write(
            f"anchor_heads: checkpoint appended to {anchor_path()}: audit #{checkpoint.audit_seq}, "
            f"{heads} task head(s) new since the one before"
        )
