from django.apps import AppConfig
from django.urls import register_converter


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        from tasks.core.parsing import IdConverter

        # <id:…>: every id in a console URL fits its column (a longer one matches no route), registered before any
        # view module builds its patterns.
        register_converter(IdConverter, "id")
