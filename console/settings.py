"""Reckon settings. Everything deployment-specific comes from the environment.

RECKON_ENV         production (default) | development (./dev demo) | test (pytest, ./dev test); see below
DJANGO_SECRET_KEY, DJANGO_ALLOWED_HOSTS, RECKON_RETENTION_KEY, RECKON_ANCHOR_KEY   required in production (start-up
                   refuses without)
DJANGO_DEBUG       1 turns DEBUG on (default: off in production, on in development and test)
RECKON_HTTPS       1 when served over TLS (redirect, secure cookies, HSTS); each also on its own: RECKON_SSL_REDIRECT,
                   RECKON_SECURE_COOKIES, RECKON_HSTS_SECONDS, RECKON_HSTS_INCLUDE_SUBDOMAINS, RECKON_HSTS_PRELOAD
RECKON_PROXY_SSL_HEADER 1 behind a proxy that sets X-Forwarded-Proto; DJANGO_CSRF_TRUSTED_ORIGINS comma-separated
RECKON_LOGIN_FAILURE_LIMIT, RECKON_LOGIN_COOLOFF_MINUTES   login throttling (django-axes)

DATABASE_URL      default: SQLite file data/reckon.sqlite3 (WAL, IMMEDIATE transactions, busy timeout)
RECKON_CONN_MAX_AGE seconds a database connection is kept (default 600: persistent)
RECKON_PG_PREPARE  "off" stops psycopg preparing the step's statements (a pooler that cannot keep them)
RECKON_API_SNAPSHOT_ROWS rows of task snapshots a web process keeps between an agent's requests (default 25,000)
CELERY_BROKER_URL default: filesystem broker under data/broker (no server); redis://… or amqp://… to scale out
"""

import base64
import binascii
import ipaddress
import os
import sys
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from console.database_url import parse_database_url, with_postgres_options
from observability.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

# The mode (RECKON_ENV): "production" (the default), "development" (./dev demo) or "test" (pytest, ./dev test).
# Production is what a process gets unless something says otherwise: gunicorn, a Celery worker or beat, manage.py
# run by hand all start as a deployment would, and forgetting a variable stops them instead of running with a public
# default. Only the development entry points choose another mode, explicitly: the `dev` script exports RECKON_ENV
# for demo and test, and when the settings are imported by pytest or by mypy's Django plugin (development tools that
# a deployment's processes never import) the mode is test unless RECKON_ENV says otherwise. The mode is exported to
# the environment, so every process a test starts (workers, the kill matrix, manage.py) runs in the test's mode.
# `manage.py makemigrations` is such a tool too: it reads the models and writes migration files into the source
# tree — never run by a deployment (its migrations are committed), never serving, never reading a secret.
_DEVELOPMENT_TOOLS = ("pytest", "mypy")
_DEVELOPMENT_COMMANDS = ("makemigrations",)
RECKON_ENV = os.environ.get("RECKON_ENV", "") or (
    "test"
    if any(tool in sys.modules for tool in _DEVELOPMENT_TOOLS)
    else "development"
    if Path(sys.argv[0]).name == "manage.py" and sys.argv[1:2] and sys.argv[1] in _DEVELOPMENT_COMMANDS
    else "production"
)
if RECKON_ENV not in ("production", "development", "test"):
    raise ImproperlyConfigured(f"RECKON_ENV must be production, development or test, not {RECKON_ENV!r}")
os.environ["RECKON_ENV"] = RECKON_ENV
PRODUCTION = RECKON_ENV == "production"
# The demo's and the tests' key: public (it is in this file), so production refuses it.
DEVELOPMENT_SECRET_KEY = "reckon-dev-only-not-secret"  # noqa: S105


def _required(name: str, hint: str) -> str:
    """A variable a deployment must set: refused at start-up, naming it, rather than defaulted and warned about."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(
            f"{name} is not set: {hint} (RECKON_ENV={RECKON_ENV}; see docs/operations.md, Secure defaults)"
        )
    return value


def _private_dir(path: Path) -> Path:
    """A data directory only the service's user can enter (0700), whatever the umask. An existing one is left as
    the operator made it."""
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)
    return path


DATA_DIR = _private_dir(Path(os.environ.get("RECKON_DATA_DIR", BASE_DIR / "data")))

if PRODUCTION:
    SECRET_KEY = _required(
        "DJANGO_SECRET_KEY", "a long random string, the same for every process, e.g. secrets.token_urlsafe(50)"
    )
    if SECRET_KEY == DEVELOPMENT_SECRET_KEY:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is the public development key: set a random one")
    ALLOWED_HOSTS = [
        h.strip()
        for h in _required("DJANGO_ALLOWED_HOSTS", "the host names served, comma-separated").split(",")
        if h.strip()
    ]
else:
    SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", DEVELOPMENT_SECRET_KEY)
    ALLOWED_HOSTS = [h.strip() for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")]
# DEBUG shows tracebacks and settings to anyone: on only when DJANGO_DEBUG=1 says so, or by default in the
# development and test modes (chosen explicitly, above).
DEBUG = os.environ.get("DJANGO_DEBUG", "0" if PRODUCTION else "1") == "1"

# HTTPS (docs/operations.md, Secure defaults). RECKON_HTTPS=1 when the site is served over TLS: HTTP is redirected to
# HTTPS,
# cookies are sent over HTTPS only, and browsers are told to use HTTPS for RECKON_HSTS_SECONDS (default a year).
# Each can be set on its own. RECKON_PROXY_SSL_HEADER=1 only behind a proxy that sets X-Forwarded-Proto itself
# (and strips it from clients): otherwise a client could claim HTTPS.
_HTTPS = os.environ.get("RECKON_HTTPS", "0") == "1"


def _flag(name: str, default: bool) -> bool:
    return os.environ.get(name, "1" if default else "0") == "1"


SECURE_SSL_REDIRECT = _flag("RECKON_SSL_REDIRECT", _HTTPS)
SESSION_COOKIE_SECURE = _flag("RECKON_SECURE_COOKIES", _HTTPS)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = int(os.environ.get("RECKON_HSTS_SECONDS", "31536000" if _HTTPS else "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _flag("RECKON_HSTS_INCLUDE_SUBDOMAINS", SECURE_HSTS_SECONDS > 0)
# Preloading is a commitment for every subdomain, hard to undo: only when asked.
SECURE_HSTS_PRELOAD = _flag("RECKON_HSTS_PRELOAD", False)
if _flag("RECKON_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Origins (scheme://host[:port]) allowed to post forms when the request came through another host name or a proxy.
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "axes",
    "console",
    "api",
    "hooks",
    "ninja",
    "guardian",
    "tasks",
    "leases",
    "audit",
    "retention",
    "reference",
    "integrations",
    "harness",
]

AUTHENTICATION_BACKENDS = [
    # First: a user name locked out by too many failed logins is refused before its password is even checked.
    "console.throttling.LoginThrottle",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the console's CSS and htmx, the API docs page's Swagger UI) from the web process itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page requires a login unless its view says otherwise (login_not_required): a new view is closed.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A named refusal no view caught becomes the refusal page with its sentence and a 4xx, never a 500.
    "console.middleware.RefusalMiddleware",
    # Last: turns a login refused for throttling into a 429 page.
    "axes.middleware.AxesMiddleware",
]

# Login throttling (console/throttling.py, django-axes): after RECKON_LOGIN_FAILURE_LIMIT failed logins for one user
# name from one client address, that pair is refused for RECKON_LOGIN_COOLOFF_MINUTES (each further try restarts
# it); a successful login clears the count. The client address is the connection's own (REMOTE_ADDR), never a
# header a client could forge: behind a proxy every client shares the proxy's address, and the count is per user name.
AXES_FAILURE_LIMIT = int(os.environ.get("RECKON_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("RECKON_LOGIN_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# The lockout names its limit and how long it lasts (console.throttling.locked_out), as every refusal does.
AXES_LOCKOUT_CALLABLE = "console.throttling.locked_out"
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]

ROOT_URLCONF = "console.urls"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "task-list"
LOGOUT_REDIRECT_URL = "login"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

SQLITE_OPTIONS = {
    # Writers take the lock at BEGIN, so a conditional UPDATE never fails half-way on lock upgrade.
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
}

DATABASES = {
    "default": parse_database_url(  # a PostgreSQL primary and its standbys too: console/database_url.py
        os.environ.get("DATABASE_URL", f"sqlite:///{DATA_DIR / 'reckon.sqlite3'}"),
        # Persistent connections in every process (web and worker): a connection per step would cost a connect.
        conn_max_age=int(os.environ.get("RECKON_CONN_MAX_AGE", "600")),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = SQLITE_OPTIONS
    # A file, not memory: tests run real threads with their own connections. The suffix lets
    # several test runs share a checkout without sharing a database.
    _suffix = os.environ.get("RECKON_TEST_DB_SUFFIX", "")
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test-reckon{_suffix}.sqlite3")}
    # The database file readable by the service's user only, whatever the umask: made here, empty (SQLite takes an
    # empty file for an empty database), before the first connection would make it 0644. SQLite gives its -wal and
    # -shm files the database file's permissions.
    _sqlite_file = str(DATABASES["default"]["NAME"])
    if _sqlite_file and _sqlite_file != ":memory:" and not _sqlite_file.startswith("file:"):
        try:
            os.close(os.open(_sqlite_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass
        except FileNotFoundError:
            pass  # its folder is not there: SQLite will say so at the first connection
else:
    # Prepared step statements (RECKON_PG_PREPARE=off for a pooler that cannot keep them), no JIT: the one rule.
    with_postgres_options(DATABASES["default"], prepare=os.environ.get("RECKON_PG_PREPARE", "on") != "off")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A person's own password (the console's password change): long, not the user name, not a common one.
AUTH_PASSWORD_VALIDATORS: list[dict[str, object]] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
if RECKON_ENV == "test":
    # The suite sets and checks passwords hundreds of times (every browser login twice); Django's default hasher
    # (PBKDF2, 1,000,000 rounds) spends 0.45 s of CPU on each. Production and development keep it; a test whose
    # password a server in production mode checks hashes it with PBKDF2 (tests/test_production_server.py).
    PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
# Outside DEBUG, static files are served (by WhiteNoise) from STATIC_ROOT as `manage.py collectstatic` leaves them
# (`./dev serve` runs it): each name carries a hash of its content, so browsers may cache it for good, and gzip
# copies are made once. Under DEBUG (the demo; tests, as the environment sets DEBUG at import) from the apps' folders
# as they are, with nothing to collect. DEBUG here is the environment's, before a test runner overrides it.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_AUTOREFRESH = DEBUG

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = _private_dir(DATA_DIR / "broker")
    for _sub in ("out", "processed", "control"):
        _private_dir(_broker_dir / _sub)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "data_folder_processed": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),  # exchange tables; kombu's default is the working dir
    }
CELERY_TASK_ACKS_LATE = True
CELERY_BEAT_SCHEDULE = {
    # Finds every task needing work from the database alone: lost or delayed messages cost only latency.
    "recovery-scan": {"task": "tasks.recovery_scan", "schedule": float(os.environ.get("RECKON_SCAN_SECONDS", "15"))},
}
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

# The object store the reference agent migrates into (the simulator in development and tests).
RECKON_OBJECTSTORE_URL = os.environ.get("RECKON_OBJECTSTORE_URL", "http://127.0.0.1:8100")
# "remote": the store dedupes by op key; "tag": it does not, so the connector queries by the op-key tag first.
RECKON_OBJECTSTORE_IDEMPOTENCY = os.environ.get("RECKON_OBJECTSTORE_IDEMPOTENCY", "remote")
# How long the object-store connector waits for an answer (below RECKON_REQUEST_DEADLINE_SECONDS).
RECKON_OBJECTSTORE_TIMEOUT = float(os.environ.get("RECKON_OBJECTSTORE_TIMEOUT_SECONDS", "5"))

# The agent API: requests a token may make a minute (0: no limit), counted in the cache below.
RECKON_API_RATE = int(os.environ.get("RECKON_API_RATE", "6000"))
# Rows (a task, its nodes, its open operations) of the snapshots each web process keeps for the next request of a
# task's holder (api.steps.RECENT; about 3.4 KB each: 25,000 ≈ 85 MB per process, a task at the node cap kept); 0
# keeps none.
RECKON_API_SNAPSHOT_ROWS = int(os.environ.get("RECKON_API_SNAPSHOT_ROWS", "25000"))
# RECKON_CACHE_URL=redis://… shares the cache (the API's rate counts) between web processes; default: per process.
if os.environ.get("RECKON_CACHE_URL"):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": os.environ["RECKON_CACHE_URL"],
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Leases (DESIGN §7): short agent leases, renewed; within the grace only the same holder may renew.
RECKON_LEASE_TTL = timedelta(seconds=int(os.environ.get("RECKON_LEASE_TTL_SECONDS", "30")))
RECKON_LEASE_GRACE = timedelta(seconds=int(os.environ.get("RECKON_LEASE_GRACE_SECONDS", "15")))
# A person's takeover lease: renewed by the open console page; the grace covers a dropped connection.
RECKON_OPERATOR_LEASE_TTL = timedelta(seconds=int(os.environ.get("RECKON_OPERATOR_LEASE_TTL_SECONDS", "120")))
# Approvals (tasks/people/approvals.py): an approval permits the exact requests it was shown, under the plan revision
# it was given under, until it expires on the database clock — after RECKON_APPROVAL_TTL_SECONDS by default; the
# approver may choose another validity, up to RECKON_APPROVAL_TTL_MAX_SECONDS.
RECKON_APPROVAL_TTL = timedelta(seconds=int(os.environ.get("RECKON_APPROVAL_TTL_SECONDS", "3600")))
RECKON_APPROVAL_TTL_MAX = timedelta(seconds=int(os.environ.get("RECKON_APPROVAL_TTL_MAX_SECONDS", "86400")))
if not timedelta(0) < RECKON_APPROVAL_TTL <= RECKON_APPROVAL_TTL_MAX:
    raise ImproperlyConfigured(
        "RECKON_APPROVAL_TTL_SECONDS must be positive and at most RECKON_APPROVAL_TTL_MAX_SECONDS"
    )
# Temp resources a task's effects leave behind are deleted once the task ends (tasks/engine/cleanup.py); this bound is
# recorded with each (TempResource.retention_until) for operators to see how long one is expected to live.
RECKON_TEMP_RETENTION = timedelta(hours=int(os.environ.get("RECKON_TEMP_RETENTION_HOURS", "24")))
# A request's deadline (docs/design.md, "A final not found"): every operation carries not_after, the database clock at
# its intent plus RECKON_REQUEST_DEADLINE_SECONDS, sent with the request; a remote that cannot fence an op key refuses
# a request that reaches it after that. A lookup's "not found" is final (a cancel or a person's "not done" may close
# the operation) only once the database clock is past not_after plus RECKON_REMOTE_CLOCK_SKEW_SECONDS, the most the
# remote's clock may run behind the database's. The deadline must exceed a connector's own timeout.
RECKON_REQUEST_DEADLINE = timedelta(seconds=int(os.environ.get("RECKON_REQUEST_DEADLINE_SECONDS", "30")))
RECKON_REMOTE_CLOCK_SKEW = timedelta(seconds=int(os.environ.get("RECKON_REMOTE_CLOCK_SKEW_SECONDS", "5")))
# Budgets and backoff (DESIGN §6): persisted per node and per task.
RECKON_DEFAULT_NODE_ATTEMPTS = 3
# A task's budget scales with its plan (tasks/core/budget.py): unstated, RECKON_TASK_ATTEMPTS_PER_NODE per node and
# at least RECKON_DEFAULT_TASK_ATTEMPTS; a plan may state its own, up to RECKON_MAX_TASK_ATTEMPTS_PER_NODE per node.
RECKON_DEFAULT_TASK_ATTEMPTS = 20
RECKON_TASK_ATTEMPTS_PER_NODE = 2
RECKON_MAX_TASK_ATTEMPTS_PER_NODE = 10
RECKON_BACKOFF_BASE = timedelta(seconds=2)
RECKON_BACKOFF_CAP = timedelta(minutes=10)

# Logs (observability/logs.py): one handler, the root's, so each record prints once; RECKON_LOG_FORMAT=json for one
# JSON object per line (with task_id, task_version, op_key where known), "text" (default) for people.
LOGGING = logging_config(
    log_format=os.environ.get("RECKON_LOG_FORMAT", "text"), level=os.environ.get("RECKON_LOG_LEVEL", "INFO")
)

# Retention (DESIGN §3.8, §3.11): sensitive inputs, debug artifacts and temp material, sealed at rest
# (AES-256-GCM) under DATA_DIR/retention, each with an expiry; checkpoints keep only {"retained": id, "version": n}.
# RECKON_RETENTION_KEY: the base64 text of 32 random bytes, e.g.
#   python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"
# Required in production (start-up refuses without it). Only in the development and test modes may it be unset: then
# retained objects are sealed with a key derived from the public development SECRET_KEY, i.e. not secret at all
# (retention/crypto.py derives none in production). Changing the key makes every stored object unreadable
# (RetentionKeyMismatch): they expire and are swept as usual.
if PRODUCTION:
    RECKON_RETENTION_KEY = _required(
        "RECKON_RETENTION_KEY",
        "the base64 text of 32 random bytes, e.g. base64.b64encode(os.urandom(32)), the same for every process",
    )
else:
    RECKON_RETENTION_KEY = os.environ.get("RECKON_RETENTION_KEY", "")
RECKON_RETENTION_TTL = {
    "sensitive_input": timedelta(days=7),
    "debug_artifact": timedelta(days=3),
    "temp_material": timedelta(days=1),
}
# Bounded extensions: an object lives at most this long after its creation, extended at most this many times.
RECKON_RETENTION_MAX_EXTENSION = timedelta(days=int(os.environ.get("RECKON_RETENTION_MAX_EXTENSION_DAYS", "30")))
RECKON_RETENTION_MAX_EXTENSIONS = 3
RECKON_RETENTION_MAX_BYTES = 16 * 1024 * 1024
RECKON_RETENTION_SWEEP_SECONDS = float(os.environ.get("RECKON_RETENTION_SWEEP_SECONDS", "300"))
CELERY_BEAT_SCHEDULE["retention-sweep"] = {"task": "retention.sweep", "schedule": RECKON_RETENTION_SWEEP_SECONDS}

# Webhooks (hooks/, docs/api.md): a delivery is tried at most RECKON_WEBHOOK_MAX_ATTEMPTS times, waiting base * 2^n
# (±25% jitter, capped) between tries: 3 min doubling to the 8 h cap spans about a day over 10 attempts.
RECKON_WEBHOOK_MAX_ATTEMPTS = int(os.environ.get("RECKON_WEBHOOK_MAX_ATTEMPTS", "10"))
RECKON_WEBHOOK_BACKOFF_BASE = timedelta(seconds=float(os.environ.get("RECKON_WEBHOOK_BACKOFF_BASE_SECONDS", "180")))
RECKON_WEBHOOK_BACKOFF_CAP = timedelta(seconds=float(os.environ.get("RECKON_WEBHOOK_BACKOFF_CAP_SECONDS", "28800")))
RECKON_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("RECKON_WEBHOOK_TIMEOUT_SECONDS", "5"))
RECKON_WEBHOOK_MAX_SUBSCRIPTIONS = int(os.environ.get("RECKON_WEBHOOK_MAX_SUBSCRIPTIONS", "20"))
# The sweep sends what is due and pending: a lost or long-delayed message costs only this much latency.
RECKON_WEBHOOK_SWEEP_SECONDS = float(os.environ.get("RECKON_WEBHOOK_SWEEP_SECONDS", "30"))
CELERY_BEAT_SCHEDULE["webhook-sweep"] = {"task": "hooks.sweep", "schedule": RECKON_WEBHOOK_SWEEP_SECONDS}
# The Celery queue deliveries are sent on ("": Celery's default queue).
RECKON_WEBHOOK_QUEUE = os.environ.get("RECKON_WEBHOOK_QUEUE", "")
# Webhook deliveries delivered or given up are deleted after this many days (the sweep does it).
RECKON_WEBHOOK_KEEP_DAYS = int(os.environ.get("RECKON_WEBHOOK_KEEP_DAYS", "7"))
# Where deliveries may go (hooks/targets.py): only to globally routable addresses. Loopback, private, link-local (the
# metadata service), CGNAT, multicast, reserved and unspecified addresses are refused, in every spelling, at
# subscription and at every delivery. RECKON_WEBHOOK_ALLOW_NETWORKS (comma-separated networks, empty by default in
# every mode) opens non-global ranges on purpose, e.g. 127.0.0.1/32 for a receiver on the same host in a demo; it
# never opens 0.0.0.0, ::, multicast, broadcast or the metadata addresses. RECKON_WEBHOOK_DENY_NETWORKS refuses
# more (public ranges of your own).
RECKON_WEBHOOK_ALLOW_NETWORKS = os.environ.get("RECKON_WEBHOOK_ALLOW_NETWORKS", "")
RECKON_WEBHOOK_DENY_NETWORKS = os.environ.get("RECKON_WEBHOOK_DENY_NETWORKS", "")
for _networks in ("RECKON_WEBHOOK_ALLOW_NETWORKS", "RECKON_WEBHOOK_DENY_NETWORKS"):
    try:
        [ipaddress.ip_network(part.strip(), strict=False) for part in globals()[_networks].split(",") if part.strip()]
    except ValueError as _invalid:
        raise ImproperlyConfigured(f"{_networks}: comma-separated networks such as 127.0.0.1/32 ({_invalid})") from None

# The agent API's Idempotency-Key records are kept 24 hours (api/idempotency.py); this forgets older ones.
CELERY_BEAT_SCHEDULE["api-idempotency-expire"] = {"task": "api.expire_idempotency_keys", "schedule": 3600.0}

# Observability (observability/, docs/operations.md "Observability"). GET /metrics answers only a request bearing this
# token
# (Authorization: Bearer …); unset, metrics are off (404). A scrape's database reading is reused for this long.
RECKON_METRICS_TOKEN = os.environ.get("RECKON_METRICS_TOKEN", "")
RECKON_METRICS_CACHE_SECONDS = float(os.environ.get("RECKON_METRICS_CACHE_SECONDS", "5"))

# Liveness (tasks/engine/recovery.py, tasks/jobs.py): the recovery scan has a queue of its
# own,
# so it never waits behind the wake-ups it queued; every worker started without -Q consumes both queues (a worker
# started with -Q names the queues it serves: give one of them RECKON_SCAN_QUEUE). A wake-up message is stale
# RECKON_WAKE_UP_EXPIRY_SECONDS after it is due, on the database clock, and until then no other wake-up is queued for
# the same task version. No message carries Celery's `expires`: each worker would judge it on its own clock.
from kombu import Queue  # noqa: E402

RECKON_SCAN_QUEUE = os.environ.get("RECKON_SCAN_QUEUE", "reckon-scan")
RECKON_WAKE_UP_EXPIRY = timedelta(seconds=float(os.environ.get("RECKON_WAKE_UP_EXPIRY_SECONDS", "120")))
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = (Queue(CELERY_TASK_DEFAULT_QUEUE), Queue(RECKON_SCAN_QUEUE))
CELERY_TASK_ROUTES = {"tasks.recovery_scan": {"queue": RECKON_SCAN_QUEUE}}
_scan_every = float(os.environ.get("RECKON_SCAN_SECONDS", "15"))
CELERY_BEAT_SCHEDULE["recovery-scan"] = {
    "task": "tasks.recovery_scan",
    "schedule": _scan_every,
    "options": {"queue": RECKON_SCAN_QUEUE},
}
# The archive step (tasks/engine/archive.py): every RECKON_ARCHIVE_SECONDS the beat moves the events of tasks that
# ended (completed, failed, stopped) and have not changed for RECKON_ARCHIVE_AFTER_SECONDS out of the hot event table;
# every read of a log sees both. 0 turns the beat's run off (``manage.py archive_events`` still runs it).
RECKON_ARCHIVE_AFTER_SECONDS = int(os.environ.get("RECKON_ARCHIVE_AFTER_SECONDS", str(30 * 24 * 3600)))
RECKON_ARCHIVE_SECONDS = float(os.environ.get("RECKON_ARCHIVE_SECONDS", "3600"))
if RECKON_ARCHIVE_AFTER_SECONDS < 0 or RECKON_ARCHIVE_SECONDS < 0:
    raise ImproperlyConfigured("RECKON_ARCHIVE_AFTER_SECONDS and RECKON_ARCHIVE_SECONDS must not be negative")
if RECKON_ARCHIVE_SECONDS:
    CELERY_BEAT_SCHEDULE["archive-events"] = {"task": "tasks.archive_events", "schedule": RECKON_ARCHIVE_SECONDS}
# Celery leaves the root logger to LOGGING above (its own handler beside it would print every worker line twice, and
# not as JSON); Celery wake-ups carry their task id in every record (observability/apps.py).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
INSTALLED_APPS.append("observability")

# Chain heads anchored outside the database (audit/anchors.py, tasks/engine/anchors.py):
# every
# RECKON_ANCHOR_SECONDS the beat appends a checkpoint of the audit chain's head and the tasks' log heads, signed with
# HMAC-SHA256 under RECKON_ANCHOR_KEY (the base64 text of 32 random bytes; the database never holds it), to
# RECKON_ANCHOR_PATH (default DATA_DIR/anchors/heads.log, created 0600, only appended to). verify_audit and
# verify_log then find a chain whose tail was cut and head rolled back. Keep the file where a database superuser
# cannot write (another host or volume, or shipped off). Required in production, like the retention key: a
# deployment that forgot it would run with every chain's cut unseen (start-up refuses, naming it; a value that is
# not the base64 text of 32 bytes is refused too). Unset (development and test only), anchoring is off and both
# say "not anchored".
if PRODUCTION:
    RECKON_ANCHOR_KEY = _required(
        "RECKON_ANCHOR_KEY",
        "the base64 text of 32 random bytes, e.g. base64.b64encode(os.urandom(32)), the same for every process and "
        "never stored with the database",
    )
    try:
        _anchor_key_bytes = len(base64.b64decode(RECKON_ANCHOR_KEY, validate=True))
    except (binascii.Error, ValueError):
        _anchor_key_bytes = -1
    if _anchor_key_bytes != 32:  # the value is a secret: named, never echoed
        raise ImproperlyConfigured(
            "RECKON_ANCHOR_KEY is not the base64 text of 32 bytes"
            + (f" (it decodes to {_anchor_key_bytes})" if _anchor_key_bytes >= 0 else " (not valid base64)")
            + ": set e.g. base64.b64encode(os.urandom(32))"
        )
else:
    RECKON_ANCHOR_KEY = os.environ.get("RECKON_ANCHOR_KEY", "")
RECKON_ANCHOR_PATH = os.environ.get("RECKON_ANCHOR_PATH", "")
RECKON_ANCHOR_SECONDS = float(os.environ.get("RECKON_ANCHOR_SECONDS", "300"))
CELERY_BEAT_SCHEDULE["anchor-heads"] = {"task": "audit.anchor_heads", "schedule": RECKON_ANCHOR_SECONDS}
# Every change of access the database captured (audit/account_changes.py: triggers on the account tables, whatever
# made the change) is put on the audit chain this often.
RECKON_ACCOUNT_FOLD_SECONDS = float(os.environ.get("RECKON_ACCOUNT_FOLD_SECONDS", "60"))
CELERY_BEAT_SCHEDULE["account-changes-fold"] = {
    "task": "audit.fold_account_changes",
    "schedule": RECKON_ACCOUNT_FOLD_SECONDS,
}

# Traces (observability/tracing.py): off unless RECKON_TRACES is console, file:<path> or otlp. The middleware opens a
# span per request when on and costs one check when off.
RECKON_TRACES = os.environ.get("RECKON_TRACES", "")
MIDDLEWARE.insert(0, "observability.tracing.TracingMiddleware")

# One beat (leases/beat.py, docs/operations.md "Workers, and one beat"): any number of hosts may run `./dev beat`;
# only the one holding the beat lease (a database row, timed by the database's clock) sends the periodic messages,
# renewing it every third of RECKON_BEAT_LEASE_SECONDS. The others send nothing and try again as often: a holder
# stopped by SIGTERM gives it back at once, one killed outright loses it when its TTL has passed.
CELERY_BEAT_SCHEDULER = "leases.beat:LeasedScheduler"
RECKON_BEAT_LEASE_TTL = timedelta(seconds=float(os.environ.get("RECKON_BEAT_LEASE_SECONDS", "30")))
