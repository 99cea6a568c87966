from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"
