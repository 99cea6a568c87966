from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"

    def ready(self) -> None:
        from leases.services import bar_agents_in
        from tasks.core.lifecycle import AGENT_LEASABLE, TaskStatus

        bar_agents_in(frozenset(s.value for s in set(TaskStatus) - AGENT_LEASABLE))
        from tasks.access import account_audit  # noqa: F401  # audits superuser/staff flag changes (createsuperuser, admin)
