"""Settings come from the environment; the defaults need no server at all."""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from kombu import Connection, Exchange, Queue

from console.celery import app


def test_the_default_broker_needs_no_server_and_carries_a_message(tmp_path) -> None:
    """The embedded default: a filesystem broker under the data folder, no Redis or RabbitMQ required."""
    assert settings.CELERY_BROKER_URL.startswith("filesystem://") or "CELERY_BROKER_URL" in os.environ
    folder = tmp_path / "broker"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(folder)}
    queue = Queue("probe", Exchange("probe"), routing_key="probe")
    with Connection("filesystem://", transport_options=options) as conn:
        conn.Producer().publish({"task_id": 7}, exchange=queue.exchange, routing_key="probe", declare=[queue])
        simple = conn.SimpleQueue(queue)  # type: ignore[arg-type]  # kombu accepts a Queue; its stubs say str
        message = simple.get(timeout=5)
        assert message.payload == {"task_id": 7}
        message.ack()
        simple.close()
    assert app.conf.broker_url == settings.CELERY_BROKER_URL
    assert app.conf.task_acks_late is True


def test_sqlite_runs_in_wal_mode_with_immediate_transactions_and_a_busy_timeout(db: None) -> None:
    from django.db import connection

    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] >= 5000
    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_database_and_broker_urls_come_from_the_environment() -> None:
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'; django.setup(); "
        "from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE'], s.DATABASES['default']['NAME'], s.CELERY_BROKER_URL)"
    )
    env = {
        "DATABASE_URL": "postgres://someone@db.example:5432/reckon_prod",
        "CELERY_BROKER_URL": "redis://cache.example:6379/0",
        "PATH": "/usr/bin:/bin",
        "RECKON_ENV": "test",  # the development keys: this test is about the database and broker URLs
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)  # noqa: S603
    assert out.stdout.split() == ["django.db.backends.postgresql", "reckon_prod", "redis://cache.example:6379/0"]


@pytest.mark.parametrize(("switch", "threshold"), [(None, "5"), ("on", "5"), ("off", "None")])
def test_the_step_statements_are_prepared_on_postgresql_unless_turned_off(switch: str | None, threshold: str) -> None:
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'; django.setup(); "
        "from django.conf import settings as s; print(s.DATABASES['default']['OPTIONS']['prepare_threshold'])"
    )
    env = {
        "DATABASE_URL": "postgres://someone@db.example:5432/reckon_prod",
        "PATH": "/usr/bin:/bin",
        "RECKON_ENV": "test",
    }
    if switch is not None:
        env["RECKON_PG_PREPARE"] = switch
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)  # noqa: S603
    assert out.stdout.split() == [threshold]
