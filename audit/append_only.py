"""Which append-only triggers must be in the database, and a check that they are there and enabled.

The triggers (audit/migrations/0002, 0003 and 0006, tasks/migrations/0009) refuse an UPDATE, DELETE or TRUNCATE whoever
connects; only the tables' owner (or a superuser) can drop or disable them, and a later migration that makes SQLite
rebuild a table drops its triggers silently. The verify commands report a trigger that is gone, so neither goes
unseen. The account-change capture triggers (audit/migrations/0006) are checked with the audit chain's.
"""

from collections.abc import Mapping, Sequence

from django.db import DEFAULT_DB_ALIAS, connections

from audit import capture_sql

# vendor → table → trigger names
type Triggers = Mapping[str, Mapping[str, Sequence[str]]]

_CHAINS: Triggers = {
    "postgresql": {
        "audit_auditevent": ("audit_no_update", "audit_no_delete", "audit_no_truncate"),
        "audit_audithead": ("audit_head_forward", "audit_head_no_delete", "audit_head_no_truncate"),
    },
    "sqlite": {
        "audit_auditevent": ("audit_no_update", "audit_no_delete"),
        "audit_audithead": ("audit_head_forward", "audit_head_no_delete"),
    },
}


def _with_capture(vendor: str) -> dict[str, Sequence[str]]:
    """The chain's triggers, and those that capture every change of access (audit/migrations/0006): a capture
    trigger dropped would let a role change pass unrecorded, so it is checked like the rest."""
    return {
        **_CHAINS[vendor],
        "audit_accountchange": capture_sql.GUARD_TRIGGERS[vendor],
        "auth_user": capture_sql.USER_FLAG_TRIGGERS[vendor],
        **capture_sql.capture_trigger_names([*capture_sql.ACCOUNT_TABLES, *capture_sql.APP_TABLES], vendor),
    }


AUDIT_TRIGGERS: Triggers = {vendor: _with_capture(vendor) for vendor in ("postgresql", "sqlite")}


def missing_triggers(expected: Triggers, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The expected triggers of this database's vendor that are absent or disabled, as ``table.trigger``."""
    connection = connections[using]
    wanted = expected.get(connection.vendor, {})
    if not wanted:
        return []
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # 'O' fires in the ordinary session mode, 'A' always; 'D' is disabled, 'R' fires only on a replica.
            cursor.execute(
                "SELECT tgrelid::regclass::text, tgname FROM pg_trigger "
                "WHERE NOT tgisinternal AND tgenabled IN ('O', 'A')"
            )
        else:
            cursor.execute("SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger'")
        present = {(table, name) for table, name in cursor.fetchall()}
    return [f"{table}.{name}" for table, names in wanted.items() for name in names if (table, name) not in present]
