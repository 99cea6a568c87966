from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.anchors import read_anchors
from tasks.engine.anchors import anchored_tasks_gone
from tasks.engine.verification import missing_event_triggers, task_verify_log
from tasks.models import LoggedEvent, Task


class Command(BaseCommand):
    help = (
        "Check every task's record (contiguous, chained log ending at the task's version and head; the projection and "
        "the facts calls are made from as logged; no secrets; still reaching the heads a signed checkpoint outside the "
        "database anchored) and the log's append-only triggers; quarantine failures."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="report only, quarantine nothing")
        parser.add_argument("--task", type=int, action="append", help="check only these task ids")

    def handle(self, *args: Any, **options: Any) -> None:
        tasks = Task.objects.order_by("pk")
        if options["task"]:
            tasks = tasks.filter(pk__in=options["task"])
        anchors = read_anchors()
        self.stdout.write(f"anchors: {anchors.status()}")
        checked = failed = quarantined = 0
        events = LoggedEvent.objects.filter(task__in=tasks).count()  # before any quarantine event is added
        for task_id in tasks.values_list("pk", flat=True):
            checked += 1
            try:
                verdict = task_verify_log(task_id=task_id, quarantine=not options["dry_run"])
            except Exception as exc:  # one task's record must not keep the others from being checked
                failed += 1
                self.stdout.write(f"task {task_id}: verification failed: {type(exc).__name__}: {exc}")
                continue
            if verdict.problem:
                failed += 1
                quarantined += verdict.quarantined_now
                note = " → quarantined" if verdict.quarantined_now else ""
                self.stdout.write(f"task {task_id}: {verdict.problem}{note}")
        gone = [] if options["task"] else anchored_tasks_gone(anchors)
        for line in gone:
            self.stdout.write(line)
        for line in anchors.bad_lines:
            self.stdout.write(line)
        missing = missing_event_triggers()
        if missing:
            self.stdout.write("the event log's append-only triggers are missing or disabled: " + ", ".join(missing))
        self.stdout.write(
            f"verify_log: {checked} tasks, {events} events checked; {checked - failed} ok, {failed} with problems, "
            f"{quarantined} quarantined now" + (f"; {len(gone)} anchored task(s) gone" if gone else "")
        )
        if gone:
            raise CommandError(f"{len(gone)} task(s) a checkpoint anchored are no longer in the database")
        if failed:
            raise CommandError(f"{failed} task(s) failed verification")
        if anchors.bad_lines:
            raise CommandError(f"{len(anchors.bad_lines)} line(s) of the anchor file are not trusted")
        if missing:
            raise CommandError("the event log is not append-only in the database: " + ", ".join(missing))
