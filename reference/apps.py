"""The reference agents as an app: at start-up it registers the actions its plans name and, per task kind, the
connector a worker drives such a task with (tasks/core/actions.py, tasks/engine/registry.py). The domain never imports
it."""

from django.apps import AppConfig


class ReferenceConfig(AppConfig):
    name = "reference"
    verbose_name = "Reckon reference agents"

    def ready(self) -> None:
        from reference import migrate_project, migrate_table
        from tasks.core.actions import register_action
        from tasks.engine.registry import register_kind

        for name, description in migrate_project.STORE_ACTIONS.items():
            register_action(name, description=description, inputs=migrate_project.STORE_INPUTS[name])
        for name, description in migrate_table.PG_ACTIONS.items():  # driven over the API: no connector here
            register_action(name, description=description)
        # The demo (reference/demo.py, manage.py load_demo) is a task of the same kind.
        register_kind(migrate_project.KIND, connector=migrate_project.connector)
