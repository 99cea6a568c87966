import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("reckon")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery entry points live in <app>/jobs.py so that "task" always means the domain object.
app.autodiscover_tasks(related_name="jobs")
