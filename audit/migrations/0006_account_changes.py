"""Account changes captured by the database (audit.models.AccountChange): triggers on Django's and django-guardian's
account tables write a row for every change of access, whatever makes it (a service, the Django admin, a shell, a
bulk update, raw SQL); audit/account_changes.py folds each into the audit chain. The capture table is append-only
but for setting each row's audit entry once (audit/capture_sql.py)."""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from audit import capture_sql


def _drops(vendor: str) -> list[str]:
    on = {"postgresql": " ON {}", "sqlite": ""}[vendor]
    statements = capture_sql.drop_capture(capture_sql.ACCOUNT_TABLES, vendor)
    statements += [f"DROP TRIGGER IF EXISTS {n}{on.format('auth_user')};" for n in capture_sql.USER_FLAG_TRIGGERS[vendor]]
    statements += [
        f"DROP TRIGGER IF EXISTS {n}{on.format('audit_accountchange')};" for n in capture_sql.GUARD_TRIGGERS[vendor]
    ]
    if vendor == "postgresql":
        statements += [
            "DROP FUNCTION IF EXISTS audit_capture_auth_user();",
            "DROP FUNCTION IF EXISTS audit_account_change_guard();",
        ]
    return statements


POSTGRES = [capture_sql.POSTGRES_GUARD, capture_sql.POSTGRES_USER_FLAGS, *capture_sql.postgres_capture(capture_sql.ACCOUNT_TABLES)]
POSTGRES_DROP = _drops("postgresql")
# Module-level, as in 0002 and 0003: the test suite drops and makes them again around a flush (tests/conftest.py).
SQLITE = [*capture_sql.SQLITE_GUARD, *capture_sql.SQLITE_USER_FLAGS, *capture_sql.sqlite_capture(capture_sql.ACCOUNT_TABLES)]
SQLITE_DROP = _drops("sqlite")


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    for sql in POSTGRES if vendor == "postgresql" else SQLITE if vendor == "sqlite" else []:
        schema_editor.execute(sql, params=None)


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    for sql in POSTGRES_DROP if vendor == "postgresql" else SQLITE_DROP if vendor == "sqlite" else []:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0005_actor_index_by_id"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("guardian", "0003_remove_groupobjectpermission_guardian_gr_content_ae6aec_idx_and_more"),
    ]

    operations = [
        migrations.CreateModel(
            name="AccountChange",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("at", models.DateTimeField()),
                ("table_name", models.CharField(max_length=60)),
                ("operation", models.CharField(max_length=10)),
                ("change", models.JSONField(default=dict)),
                ("audit_seq", models.PositiveBigIntegerField(blank=True, null=True)),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("audit_seq__isnull", True)),
                        fields=["id"],
                        name="audit_account_change_unfolded",
                    )
                ],
            },
        ),
        migrations.RunPython(create, drop),
    ]
