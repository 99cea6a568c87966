from django.apps import AppConfig


class RetentionConfig(AppConfig):
    name = "retention"

    def ready(self) -> None:
        from retention import checks  # noqa: F401  (registers the key checks)
