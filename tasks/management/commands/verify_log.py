from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks.models import Event, Task
from tasks.verification import task_verify_log


class Command(BaseCommand):
    help = "Check every task's event log (contiguous seq, hash chain, projection, no secrets); quarantine failures."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="report only, quarantine nothing")
        parser.add_argument("--task", type=int, action="append", help="check only these task ids")

    def handle(self, *args: Any, **options: Any) -> None:
        tasks = Task.objects.order_by("pk")
        if options["task"]:
            tasks = tasks.filter(pk__in=options["task"])
        checked = failed = quarantined = 0
        events = Event.objects.filter(task__in=tasks).count()  # before any quarantine event is added
        for task_id in tasks.values_list("pk", flat=True):
            checked += 1
            verdict = task_verify_log(task_id=task_id, quarantine=not options["dry_run"])
            if verdict.problem:
                failed += 1
                quarantined += verdict.quarantined_now
                note = " → quarantined" if verdict.quarantined_now else ""
                self.stdout.write(f"task {task_id}: {verdict.problem}{note}")
        self.stdout.write(
            f"verify_log: {checked} tasks, {events} events checked; {checked - failed} ok, {failed} with problems, "
            f"{quarantined} quarantined now"
        )
        if failed:
            raise CommandError(f"{failed} task(s) failed verification")
