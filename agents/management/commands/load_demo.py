from typing import Any

from django.core.management.base import BaseCommand

from agents.demo import migration_plan
from tasks.models import Task
from tasks.plans import task_create


class Command(BaseCommand):
    help = "Load a small demo task (a project migration plan) unless one is already there."

    def handle(self, *args: Any, **options: Any) -> None:
        if Task.objects.filter(kind="migrate_project", created_by="demo").exists():
            self.stdout.write("demo task already loaded")
            return
        task = task_create(
            kind="migrate_project",
            title="Migrate project acme",
            plan=migration_plan(),
            created_by="demo",
            project="acme",
        )
        self.stdout.write(
            f"loaded demo task {task.pk}: {task.title} (plan version {task.plan_version}, {task.nodes.count()} nodes)"
        )
