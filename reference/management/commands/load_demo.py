from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.errors import Refused
from audit.principals import Principal
from reference.demo_agent import API_KIND, DEMO_AGENT, QUICKSTART_PROJECT, demo_agent_token
from reference.demo_logins import DESCRIPTIONS, FIRST_ADMIN, demo_logins_ensure
from reference.demo_states import StoreUnavailable, demo_tasks_load, demo_tasks_loaded, quickstart_source_register
from tasks.models import Task
from tasks.reads.queries import attention_reasons


class Command(BaseCommand):
    help = (
        "Create the demo logins (fresh passwords, printed once) and, unless they are already there, the demo tasks: "
        "one per state, driven there by the reference agent against the object-store simulator, which must be "
        "running at RECKON_OBJECTSTORE_URL (./dev demo starts it)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--store-url", default="", help="the simulator (default: RECKON_OBJECTSTORE_URL)")
        parser.add_argument("--wait", type=float, default=15, help="seconds to wait for the simulator to answer")

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_logins_ensure()
        self.stdout.write("Demo logins (new passwords on every load, shown only now):")
        for login in logins:
            state = "created" if login.created else "existed, new password"
            self.stdout.write(f"  {login.username:<9} {login.password}   {DESCRIPTIONS[login.username]} ({state})")
        admin = next(Principal.of_user(login.user) for login in logins if login.username == FIRST_ADMIN)
        token = demo_agent_token(admin)
        self.stdout.write(f"Demo agent token (agent {DEMO_AGENT}, kind {API_KIND}; new on every load, shown only now):")
        self.stdout.write(f"  {token}")
        try:
            quickstart_source_register(
                project=QUICKSTART_PROJECT, store_url=options["store_url"], wait_seconds=options["wait"]
            )
        except StoreUnavailable as error:
            raise CommandError(str(error)) from error
        loaded = demo_tasks_loaded()
        if loaded:
            self.stdout.write(f"Demo tasks already loaded ({loaded}); ./dev demo --reset starts over.")
            return
        operator = next(Principal.of_user(login.user) for login in logins if login.username == "operator")
        try:
            tasks = demo_tasks_load(operator=operator, store_url=options["store_url"], wait_seconds=options["wait"])
        except (StoreUnavailable, Refused) as error:
            raise CommandError(str(error)) from error
        self.stdout.write(f"Demo tasks ({len(tasks)}):")
        for task in Task.objects.filter(pk__in=[t.pk for t in tasks]).with_attention().order_by("pk"):
            self.stdout.write(f"  #{task.pk:<4} {task.title}\n        {_status(task)}")


def _status(task: Task) -> str:
    """The status with its pause reason, and why it needs a person (the needs-attention queue's reasons)."""
    status = f"{task.status} ({task.status_reason})" if task.status_reason else task.status
    reasons = ", ".join(reason.label for reason in attention_reasons(task) if reason.value != task.status)
    return f"{status} — needs attention: {reasons}" if reasons else status
