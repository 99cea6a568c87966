"""Secure by default: a process started as a deployment starts it refuses to run without its secrets,
runs with DEBUG off, passes ``check --deploy`` with the documented production environment, keeps its data private,
throttles password guessing and audits superuser changes.

Start-up is tested in subprocesses with an environment built from nothing (no RECKON_ENV: the production default),
as gunicorn, a Celery worker or ``manage.py`` would be started on a server.
"""

import base64
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import password_validation
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from audit.services import verify_audit
from tests.simulator_fixture import ROOT

# Long enough for a slow CI machine to import Django; a refusal comes at settings import, a second or two.
START_SECONDS = 120


def production_environment(data_dir: Path) -> dict[str, str]:
    """The production environment of docs/operations.md (Secure defaults), with fresh secrets, a scratch data folder,
    and
    nothing inherited from the test run (no RECKON_ENV: a deployment's processes are production by default)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(data_dir.parent),
        "RECKON_DATA_DIR": str(data_dir),
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "reckon.example.com",
        "RECKON_RETENTION_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_ANCHOR_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RECKON_HTTPS": "1",
        "RECKON_HSTS_PRELOAD": "1",
        "DJANGO_CSRF_TRUSTED_ORIGINS": "https://reckon.example.com",
    }


def run(command: list[str], env: dict[str, str], timeout: float = START_SECONDS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "manage.py", *args], env)


SHOW_SETTINGS = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'; django.setup(); "
    "from django.conf import settings as s; print(s.RECKON_ENV, s.DEBUG, s.SECURE_SSL_REDIRECT, "
    "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.CSRF_TRUSTED_ORIGINS)"
)


# --- start-up refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("missing", "value"),
    [
        ("DJANGO_SECRET_KEY", None),
        ("DJANGO_SECRET_KEY", ""),
        ("DJANGO_SECRET_KEY", "reckon-dev-only-not-secret"),
        ("DJANGO_ALLOWED_HOSTS", None),
        ("DJANGO_ALLOWED_HOSTS", " "),
        ("RECKON_RETENTION_KEY", None),
        ("RECKON_ANCHOR_KEY", None),
        ("RECKON_ANCHOR_KEY", " "),
        ("RECKON_ANCHOR_KEY", "not base64: a passphrase"),
        ("RECKON_ANCHOR_KEY", base64.b64encode(os.urandom(16)).decode()),
    ],
    ids=[
        "no-secret-key",
        "empty-secret-key",
        "development-secret-key",
        "no-hosts",
        "blank-hosts",
        "no-retention-key",
        "no-anchor-key",
        "blank-anchor-key",
        "anchor-key-not-base64",
        "anchor-key-of-16-bytes",
    ],
)
def test_manage_py_refuses_to_start_without_each_variable(tmp_path: Path, missing: str, value: str | None) -> None:
    env = production_environment(tmp_path / "data")
    del env[missing]
    if value is not None:
        env[missing] = value
    done = manage(env, "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and missing in done.stderr, done.stderr
    assert "System check identified" not in done.stdout
    if value and value.strip() and "SECRET" not in missing:
        assert value not in done.stderr  # a key refused is named, never echoed


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool=solo", "--without-mingle"],
        [sys.executable, "-m", "celery", "-A", "console", "beat"],
        [sys.executable, "-m", "gunicorn", "-c", "console/gunicorn.conf.py", "--bind", "127.0.0.1:0"],
    ],
    ids=["celery-worker", "celery-beat", "gunicorn"],
)
def test_a_deployment_process_refuses_to_start_without_a_secret_key(tmp_path: Path, command: list[str]) -> None:
    """Each long-running process a deployment starts, not only manage.py: it ends, naming the variable, instead of
    serving with the public default."""
    env = production_environment(tmp_path / "data")
    del env["DJANGO_SECRET_KEY"]
    done = run(command, env)
    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in done.stdout + done.stderr, done.stdout + done.stderr


def test_makemigrations_is_a_development_tool_and_migrate_is_not(tmp_path: Path) -> None:
    """``manage.py makemigrations --check`` (a source-tree check) runs with nothing set; ``migrate``, which a
    deployment runs against its database, is still refused without the production variables."""
    bare = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "RECKON_DATA_DIR": str(tmp_path / "d"),
    }
    checked = manage(bare, "makemigrations", "--check", "--dry-run")
    assert checked.returncode == 0 and "No changes detected" in checked.stdout, checked.stderr
    refused = manage(bare, "migrate")
    assert refused.returncode != 0 and "DJANGO_SECRET_KEY is not set" in refused.stderr


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    env = production_environment(tmp_path / "data") | {"RECKON_ENV": "prod"}
    done = manage(env, "check")
    assert done.returncode != 0 and "RECKON_ENV must be production, development or test" in done.stderr


def test_production_is_the_default_and_runs_with_debug_off(tmp_path: Path) -> None:
    env = production_environment(tmp_path / "data")
    done = run([sys.executable, "-c", SHOW_SETTINGS], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "production",
        "False",
        "True",
        "True",
        "True",
        "31536000",
        "['https://reckon.example.com']",
    ]
    # DEBUG on only when asked for; the HTTPS settings each off when asked.
    asked = env | {"DJANGO_DEBUG": "1", "RECKON_HTTPS": "0", "DJANGO_CSRF_TRUSTED_ORIGINS": ""}
    done = run([sys.executable, "-c", SHOW_SETTINGS], asked)
    assert done.stdout.split() == ["production", "True", "False", "False", "False", "0", "[]"], done.stderr


def test_the_development_modes_need_nothing_but_are_chosen_explicitly(tmp_path: Path) -> None:
    """The demo's and the tests' defaults, only when RECKON_ENV says so (the dev script, pytest)."""
    bare = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RECKON_DATA_DIR": str(tmp_path / "data")}
    for mode in ("development", "test"):
        done = run([sys.executable, "-c", SHOW_SETTINGS], bare | {"RECKON_ENV": mode})
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[:2] == [mode, "True"]
    assert run([sys.executable, "-c", SHOW_SETTINGS], bare).returncode != 0  # no mode: production, refused


def test_this_test_run_and_every_process_it_starts_are_in_the_test_mode() -> None:
    assert settings.RECKON_ENV == "test"
    assert os.environ["RECKON_ENV"] == "test"


# --- check --deploy -------------------------------------------------------------------------------------------------


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path: Path) -> None:
    done = manage(production_environment(tmp_path / "data"), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_check_deploy_names_what_is_left_out(tmp_path: Path) -> None:
    """The check is not clean by accident: without HTTPS it fails, naming the settings."""
    env = production_environment(tmp_path / "data") | {"RECKON_HTTPS": "0", "RECKON_HSTS_PRELOAD": "0"}
    done = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    for check_id in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check_id in done.stderr, done.stderr


# --- private files --------------------------------------------------------------------------------------------------

WRITE_AND_SHOW_MODES = """
import django, os, stat
os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE probe (x integer)")
    cursor.execute("INSERT INTO probe VALUES (1)")
    data = settings.DATA_DIR
    db = data / "reckon.sqlite3"
    for path in [data, data / "broker", db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]:
        print(path.name, oct(stat.S_IMODE(path.stat().st_mode)))
"""


def test_the_data_folder_and_the_sqlite_files_are_private_to_the_service_user(tmp_path: Path) -> None:
    """Made under a permissive umask (022, the usual): the folder 0700, the database and its WAL files 0600."""
    data = tmp_path / "deep" / "data"
    env = production_environment(data)
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", WRITE_AND_SHOW_MODES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=START_SECONDS,
        check=False,
        umask=0o022,
    )
    assert done.returncode == 0, done.stderr
    modes = dict(line.split() for line in done.stdout.splitlines())
    assert modes == {
        "data": "0o700",
        "broker": "0o700",
        "reckon.sqlite3": "0o600",
        "reckon.sqlite3-wal": "0o600",
        "reckon.sqlite3-shm": "0o600",
    }
    assert stat.S_IMODE((data / "broker" / "out").stat().st_mode) == 0o700


# --- passwords and login throttling ---------------------------------------------------------------------------------


@pytest.mark.parametrize("password", ["short1!", "password12345", "alice-operator"], ids=["short", "common", "name"])
def test_weak_passwords_are_refused(db: None, password: str) -> None:
    user = User(username="alice-operator")
    with pytest.raises(ValidationError):
        password_validation.validate_password(password, user)
    password_validation.validate_password("correct horse battery staple 42", user)


def test_login_is_throttled_after_repeated_failures(db: None) -> None:
    """After the failure limit, even the right password is refused (429) for the cool-off, and no session is made;
    another user from the same address is not affected."""
    from axes.models import AccessAttempt  # type: ignore[import-untyped,unused-ignore]

    right = "a long and right password 17"
    User.objects.create_user("ann", password=right)
    User.objects.create_user("bob", password=right)
    client = Client()
    url = reverse("login")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        answer = client.post(url, {"username": "ann", "password": "a wrong guess"})
        assert answer.status_code in (200, 429)
    answer = client.post(url, {"username": "ann", "password": right})
    assert answer.status_code == 429
    said = answer.content.decode()
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    assert f"{settings.AXES_FAILURE_LIMIT} failed log-ins" in said and f"refused for {minutes} minutes" in said, said
    assert "_auth_user_id" not in client.session
    assert AccessAttempt.objects.get(username="ann").failures_since_start >= settings.AXES_FAILURE_LIMIT
    answer = Client().post(url, {"username": "bob", "password": right})
    assert answer.status_code == 302  # signed in: the lockout is ann's from this address, not everyone's


# --- superuser changes are audited ----------------------------------------------------------------------------------


def _flag_events() -> list[dict[str, object]]:
    return [
        {"actor": e.actor_id, **e.details}
        for e in AuditEvent.objects.filter(action="account_flags_changed").order_by("seq")
    ]


def test_superuser_and_staff_changes_are_audited(db: None) -> None:
    """createsuperuser, the Django admin or a shell: each change of is_superuser / is_staff is on the audit chain;
    saving without a change, or an ordinary account, records nothing."""
    User.objects.create_user("plain", password=None)
    root = User.objects.create_superuser("root", password=None)
    assert _flag_events() == [
        {
            "actor": "account_flags",
            "user": "root",
            "created": True,
            "is_superuser": [False, True],
            "is_staff": [False, True],
        }
    ]
    root.first_name = "Root"
    root.save()
    assert len(_flag_events()) == 1
    root.is_superuser = False
    root.save()
    plain = User.objects.get(username="plain")
    plain.is_staff = True
    plain.save(update_fields=["is_staff"])
    assert _flag_events()[1:] == [
        {"actor": "account_flags", "user": "root", "created": False, "is_superuser": [True, False]},
        {"actor": "account_flags", "user": "plain", "created": False, "is_staff": [False, True]},
    ]
    assert verify_audit().broken_at is None
