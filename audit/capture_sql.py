"""The SQL of the account-change capture triggers (audit.models.AccountChange), for PostgreSQL and SQLite.

Migrations call these (audit/migrations/0006 for Django's and django-guardian's account tables; the apps that own
other access tables — API tokens, scope grants — in their own migrations), so what a trigger writes is generated in
one place. Migrations run this code as it is when they run: change what a trigger writes only together with a new
migration that recreates it.

A captured row says what changed in words that outlive the rows it names (a user's name, a group's, a permission's
``app_label.codename``), looked up by the trigger while those rows still exist.
"""

from collections.abc import Sequence
from dataclasses import dataclass

# A column, or a lookup on a column, of the changed row. ``{r}`` is NEW or OLD.
_USER = "(SELECT username FROM auth_user WHERE id = {r}.user_id)"
_GROUP = "(SELECT name FROM auth_group WHERE id = {r}.group_id)"
_PERMISSION = (
    "(SELECT ct.app_label || '.' || p.codename FROM auth_permission p "
    "JOIN django_content_type ct ON ct.id = p.content_type_id WHERE p.id = {r}.permission_id)"
)
_CONTENT_TYPE = "(SELECT app_label || '.' || model FROM django_content_type WHERE id = {r}.content_type_id)"


@dataclass(frozen=True)
class Captured:
    """A table whose rows grant access: every insert, delete and (watched-column) update is captured."""

    table: str
    # (key in AccountChange.change, SQL expression with {r}) — what describes one row.
    describe: Sequence[tuple[str, str]]
    # The columns whose update is a change of access (other updates — a token's last use — are not captured).
    watched: Sequence[str]
    # Whether a new row is a change of access (a new group grants nothing until it has members or permissions).
    inserts: bool = True
    # Keys whose column holds JSON (jsonb on PostgreSQL, text on SQLite, where it is parsed so it nests).
    json_keys: Sequence[str] = ()


ACCOUNT_TABLES: Sequence[Captured] = (
    Captured(
        "auth_user_groups", (("user", _USER), ("user_id", "{r}.user_id"), ("group", _GROUP)), ("user_id", "group_id")
    ),
    Captured(
        "auth_user_user_permissions",
        (("user", _USER), ("user_id", "{r}.user_id"), ("permission", _PERMISSION)),
        ("user_id", "permission_id"),
    ),
    Captured("auth_group_permissions", (("group", _GROUP), ("permission", _PERMISSION)), ("group_id", "permission_id")),
    Captured("auth_group", (("group", "{r}.name"), ("group_id", "{r}.id")), ("name",), inserts=False),
    Captured(
        "guardian_userobjectpermission",
        (
            ("user", _USER),
            ("user_id", "{r}.user_id"),
            ("permission", _PERMISSION),
            ("content_type", _CONTENT_TYPE),
            ("object_pk", "{r}.object_pk"),
        ),
        ("user_id", "permission_id", "content_type_id", "object_pk"),
    ),
    Captured(
        "guardian_groupobjectpermission",
        (
            ("group", _GROUP),
            ("permission", _PERMISSION),
            ("content_type", _CONTENT_TYPE),
            ("object_pk", "{r}.object_pk"),
        ),
        ("group_id", "permission_id", "content_type_id", "object_pk"),
    ),
)

# Reckon's own grants, captured by their apps' migrations (api/migrations/0003, tasks/migrations/0015): an agent's API
# token (its scope of kinds and projects, its revocation) and an operator's scope grant (every task of a project or
# kind). A token's last use is not a change of access; its hash is never copied.
API_TOKENS = Captured(
    "api_apitoken",
    (
        ("token_id", "{r}.id"),
        ("agent", "{r}.agent_id"),
        ("name", "{r}.name"),
        ("kinds", "{r}.kinds"),
        ("projects", "{r}.projects"),
        ("created_by", "{r}.created_by"),
        ("revoked_by", "NULLIF({r}.revoked_by, '')"),
    ),
    ("agent_id", "token_hash", "kinds", "projects", "revoked_at"),
    json_keys=("kinds", "projects"),
)
SCOPE_GRANTS = Captured(
    "tasks_scopegrant",
    (
        ("user", _USER),
        ("user_id", "{r}.user_id"),
        ("project", "{r}.project"),
        ("kind", "{r}.kind"),
        ("granted_by", "{r}.granted_by"),
    ),
    ("user_id", "project", "kind"),
)
APP_TABLES: Sequence[Captured] = (API_TOKENS, SCOPE_GRANTS)

# auth_user itself: only its flags are access (superuser passes every Django permission check; staff opens the
# Django admin; an inactive account can do nothing). Creating an ordinary account, a login, a password change: not.
_FLAGS = ("is_superuser", "is_staff", "is_active")


def _pg_object(t: Captured, r: str) -> str:
    pairs = ", ".join(f"'{key}', {expression.format(r=r)}" for key, expression in t.describe)
    return f"jsonb_strip_nulls(jsonb_build_object({pairs}))"


def _sqlite_object(t: Captured, r: str) -> str:
    pairs = ", ".join(
        f"'{key}', {f'json({expression})' if key in t.json_keys else expression}".format(r=r)
        for key, expression in t.describe
    )
    return f"json_patch('{{}}', json_object({pairs}))"  # json_patch drops the keys whose value is null


def _differs(columns: Sequence[str], vendor: str) -> str:
    op = "IS DISTINCT FROM" if vendor == "postgresql" else "IS NOT"
    return " OR ".join(f"NEW.{c} {op} OLD.{c}" for c in columns)


_PG_INSERT = (
    "INSERT INTO audit_accountchange (at, table_name, operation, change, audit_seq) "
    "VALUES (statement_timestamp(), TG_TABLE_NAME, lower(TG_OP), {change}, NULL);"
)
_SQLITE_INSERT = (
    "INSERT INTO audit_accountchange (at, table_name, operation, change, audit_seq) "
    "VALUES (strftime('%Y-%m-%d %H:%M:%f', 'now'), '{table}', '{operation}', {change}, NULL);"
)


def postgres_capture(tables: Sequence[Captured]) -> list[str]:
    """Per table: a trigger function and AFTER INSERT/UPDATE/DELETE (row) and TRUNCATE (statement) triggers."""
    statements = []
    for t in tables:
        fn = f"audit_capture_{t.table}"
        insert = _PG_INSERT.format(change="change")
        statements.append(f"""
CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger AS $$
DECLARE change jsonb;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        change := jsonb_build_object('truncated', TG_TABLE_NAME);
    ELSIF TG_OP = 'INSERT' THEN
        change := {_pg_object(t, "NEW")};
    ELSIF TG_OP = 'DELETE' THEN
        change := {_pg_object(t, "OLD")};
    ELSE
        change := jsonb_build_object('before', {_pg_object(t, "OLD")},
                                     'after', {_pg_object(t, "NEW")});
    END IF;
    {insert}
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER {fn}_row AFTER {"INSERT OR DELETE" if t.inserts else "DELETE"} ON {t.table} FOR EACH ROW
    EXECUTE FUNCTION {fn}();
CREATE TRIGGER {fn}_update AFTER UPDATE ON {t.table} FOR EACH ROW
    WHEN ({_differs(t.watched, "postgresql")}) EXECUTE FUNCTION {fn}();
CREATE TRIGGER {fn}_truncate AFTER TRUNCATE ON {t.table} FOR EACH STATEMENT EXECUTE FUNCTION {fn}();
""")
    return statements


def sqlite_capture(tables: Sequence[Captured]) -> list[str]:
    """Per table: AFTER INSERT, DELETE and UPDATE (of a watched column) triggers; SQLite has no TRUNCATE."""
    statements = []
    for t in tables:
        name = f"audit_capture_{t.table}"
        for operation, change, when in (
            ("insert", _sqlite_object(t, "NEW"), ""),
            ("delete", _sqlite_object(t, "OLD"), ""),
            (
                "update",
                f"json_object('before', {_sqlite_object(t, 'OLD')}, 'after', {_sqlite_object(t, 'NEW')})",
                f" WHEN {_differs(t.watched, 'sqlite')}",
            ),
        ):
            if operation == "insert" and not t.inserts:
                continue
            insert = _SQLITE_INSERT.format(table=t.table, operation=operation, change=change)
            statements.append(
                f"CREATE TRIGGER {name}_{operation} AFTER {operation.upper()} ON {t.table}{when} BEGIN {insert} END;"
            )
    return statements


def capture_trigger_names(tables: Sequence[Captured], vendor: str) -> dict[str, tuple[str, ...]]:
    """table → the names of its capture triggers, for audit.append_only's check that they are all there."""
    names = {}
    for t in tables:
        if vendor == "postgresql":
            suffixes: tuple[str, ...] = ("row", "update", "truncate")
        else:
            suffixes = ("insert", "delete", "update") if t.inserts else ("delete", "update")
        names[t.table] = tuple(f"audit_capture_{t.table}_{s}" for s in suffixes)
    return names


def drop_capture(tables: Sequence[Captured], vendor: str) -> list[str]:
    statements = []
    for table, names in capture_trigger_names(tables, vendor).items():
        on = f" ON {table}" if vendor == "postgresql" else ""
        statements += [f"DROP TRIGGER IF EXISTS {name}{on};" for name in names]
        if vendor == "postgresql":
            statements.append(f"DROP FUNCTION IF EXISTS audit_capture_{table}();")
    return statements


# auth_user's flags, and the capture table's own guard: written out, not generated (one table each).
POSTGRES_USER_FLAGS = f"""
CREATE OR REPLACE FUNCTION audit_capture_auth_user() RETURNS trigger AS $$
DECLARE change jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NOT (NEW.is_superuser OR NEW.is_staff) THEN RETURN NULL; END IF;
        change := jsonb_build_object('user', NEW.username, 'created', true)
            || CASE WHEN NEW.is_superuser THEN '{{"is_superuser": [false, true]}}'::jsonb ELSE '{{}}'::jsonb END
            || CASE WHEN NEW.is_staff THEN '{{"is_staff": [false, true]}}'::jsonb ELSE '{{}}'::jsonb END;
    ELSIF TG_OP = 'DELETE' THEN
        IF NOT (OLD.is_superuser OR OLD.is_staff) THEN RETURN NULL; END IF;
        change := jsonb_build_object('user', OLD.username, 'deleted', true);
    ELSE
        change := jsonb_build_object('user', NEW.username, 'created', false)
            || CASE WHEN NEW.is_superuser IS DISTINCT FROM OLD.is_superuser
                THEN jsonb_build_object('is_superuser', jsonb_build_array(OLD.is_superuser, NEW.is_superuser))
                ELSE '{{}}'::jsonb END
            || CASE WHEN NEW.is_staff IS DISTINCT FROM OLD.is_staff
                THEN jsonb_build_object('is_staff', jsonb_build_array(OLD.is_staff, NEW.is_staff))
                ELSE '{{}}'::jsonb END
            || CASE WHEN NEW.is_active IS DISTINCT FROM OLD.is_active
                THEN jsonb_build_object('is_active', jsonb_build_array(OLD.is_active, NEW.is_active))
                ELSE '{{}}'::jsonb END;
    END IF;
    {_PG_INSERT.format(change="change")}
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_capture_auth_user_row AFTER INSERT OR DELETE ON auth_user FOR EACH ROW
    EXECUTE FUNCTION audit_capture_auth_user();
CREATE TRIGGER audit_capture_auth_user_update AFTER UPDATE ON auth_user FOR EACH ROW
    WHEN ({_differs(_FLAGS, "postgresql")}) EXECUTE FUNCTION audit_capture_auth_user();
"""


def _sqlite_flag(flag: str) -> str:
    as_json = "json(CASE WHEN {r}.%s THEN 'true' ELSE 'false' END)" % flag  # noqa: UP031
    before, after = as_json.format(r="OLD"), as_json.format(r="NEW")
    return f"'{flag}', CASE WHEN NEW.{flag} IS NOT OLD.{flag} THEN json_array({before}, {after}) END"


SQLITE_USER_FLAGS = [
    "CREATE TRIGGER audit_capture_auth_user_insert AFTER INSERT ON auth_user "
    "WHEN NEW.is_superuser OR NEW.is_staff BEGIN "
    + _SQLITE_INSERT.format(
        table="auth_user",
        operation="insert",
        change="json_patch(json_object('user', NEW.username, 'created', json('true')), json_object("
        "'is_superuser', CASE WHEN NEW.is_superuser THEN json('[false,true]') END, "
        "'is_staff', CASE WHEN NEW.is_staff THEN json('[false,true]') END))",
    )
    + " END;",
    "CREATE TRIGGER audit_capture_auth_user_delete AFTER DELETE ON auth_user "
    "WHEN OLD.is_superuser OR OLD.is_staff BEGIN "
    + _SQLITE_INSERT.format(
        table="auth_user", operation="delete", change="json_object('user', OLD.username, 'deleted', json('true'))"
    )
    + " END;",
    f"CREATE TRIGGER audit_capture_auth_user_update AFTER UPDATE ON auth_user WHEN {_differs(_FLAGS, 'sqlite')} BEGIN "
    + _SQLITE_INSERT.format(
        table="auth_user",
        operation="update",
        change="json_patch(json_object('user', NEW.username, 'created', json('false')), json_object("
        + ", ".join(_sqlite_flag(flag) for flag in _FLAGS)
        + "))",
    )
    + " END;",
]
USER_FLAG_TRIGGERS = {
    "postgresql": ("audit_capture_auth_user_row", "audit_capture_auth_user_update"),
    "sqlite": ("audit_capture_auth_user_insert", "audit_capture_auth_user_delete", "audit_capture_auth_user_update"),
}

# A captured row is never removed nor altered; only its audit entry is set, once, and only to the audit event that
# records it (its details name the row), so no row can be marked recorded without being on the chain.
POSTGRES_GUARD = """
CREATE OR REPLACE FUNCTION audit_account_change_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.audit_seq IS NULL AND NEW.audit_seq IS NOT NULL AND NEW.id = OLD.id AND NEW.at = OLD.at
                AND NEW.table_name = OLD.table_name AND NEW.operation = OLD.operation AND NEW.change = OLD.change
                AND (SELECT details ->> 'capture' FROM audit_auditevent WHERE seq = NEW.audit_seq) = NEW.id::text THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'account changes are append-only (% refused): only their audit entry is set, once', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_account_change_guard BEFORE UPDATE OR DELETE ON audit_accountchange FOR EACH ROW
    EXECUTE FUNCTION audit_account_change_guard();
CREATE TRIGGER audit_account_change_no_truncate BEFORE TRUNCATE ON audit_accountchange FOR EACH STATEMENT
    EXECUTE FUNCTION audit_account_change_guard();
"""
SQLITE_GUARD = [
    "CREATE TRIGGER audit_account_change_guard BEFORE UPDATE ON audit_accountchange "
    "WHEN OLD.audit_seq IS NOT NULL OR NEW.audit_seq IS NULL OR NEW.id IS NOT OLD.id OR NEW.at IS NOT OLD.at "
    "OR NEW.table_name IS NOT OLD.table_name OR NEW.operation IS NOT OLD.operation OR NEW.change IS NOT OLD.change "
    "OR (SELECT json_extract(details, '$.capture') FROM audit_auditevent WHERE seq = NEW.audit_seq) IS NOT NEW.id "
    "BEGIN SELECT RAISE(ABORT, 'account changes are append-only: only their audit entry is set, once'); END;",
    "CREATE TRIGGER audit_account_change_no_delete BEFORE DELETE ON audit_accountchange "
    "BEGIN SELECT RAISE(ABORT, 'account changes are append-only (DELETE refused)'); END;",
]
GUARD_TRIGGERS = {
    "postgresql": ("audit_account_change_guard", "audit_account_change_no_truncate"),
    "sqlite": ("audit_account_change_guard", "audit_account_change_no_delete"),
}
