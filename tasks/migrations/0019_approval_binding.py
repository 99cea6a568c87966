"""An approval bound to the exact call (tasks/decide/approval_binding.py): the approval node's binding columns, the
checks that an approved approval names a digest, a plan revision no later than its node's, an expiry and a person,
and a trigger that lets a binding change only to a later approval.

The trigger refuses an UPDATE that rewrites or clears a node's approval binding unless the new one is recorded at a
later event (a re-approval): an ORM or SQL update that stretches an expiry, swaps a digest or moves a binding to
another revision is refused by the database, whoever connects. A binding forged at a later seq is refused at the
gated start, which checks the binding against the event at its seq (tasks.engine.verification). It is created last:
on SQLite, the constraints above rebuild the node table, which drops the table's triggers (verify_log reports a
trigger that is gone: tasks.engine.verification.EVENT_TRIGGERS).
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

_BINDING = (
    "approval_digest",
    "approval_requests",
    "approval_plan_version",
    "approval_expires_at",
    "approval_seq",
    "approved_by",
)
_OLD = ", ".join(f"OLD.{c}" for c in _BINDING)
_NEW = ", ".join(f"NEW.{c}" for c in _BINDING)
_MESSAGE = "an approval binding changes only by a later approval"
POSTGRES = f"""
CREATE OR REPLACE FUNCTION node_approval_binding_fixed() RETURNS trigger AS $$
BEGIN
    IF OLD.approval_seq IS NOT NULL AND (NEW.approval_seq IS NULL OR NEW.approval_seq <= OLD.approval_seq)
       AND ROW({_NEW}) IS DISTINCT FROM ROW({_OLD}) THEN
        RAISE EXCEPTION '{_MESSAGE}';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER node_approval_binding_fixed BEFORE UPDATE OF {", ".join(_BINDING)} ON tasks_node
    FOR EACH ROW EXECUTE FUNCTION node_approval_binding_fixed();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS node_approval_binding_fixed ON tasks_node;
DROP FUNCTION IF EXISTS node_approval_binding_fixed();
"""
_CHANGED = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in _BINDING)
SQLITE = [
    f"CREATE TRIGGER node_approval_binding_fixed BEFORE UPDATE OF {', '.join(_BINDING)} ON tasks_node "
    "WHEN OLD.approval_seq IS NOT NULL AND (NEW.approval_seq IS NULL OR NEW.approval_seq <= OLD.approval_seq) "
    f"AND ({_CHANGED}) "
    f"BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END;"
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS node_approval_binding_fixed;"]


def create(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES] if vendor == "postgresql" else SQLITE if vendor == "sqlite" else []
    for sql in statements:
        schema_editor.execute(sql, params=None)


def drop(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    vendor = schema_editor.connection.vendor
    statements = [POSTGRES_DROP] if vendor == "postgresql" else SQLITE_DROP if vendor == "sqlite" else []
    for sql in statements:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0018_operation_not_after'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='approval_digest',
            field=models.CharField(blank=True, max_length=71),
        ),
        migrations.AddField(
            model_name='node',
            name='approval_expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='node',
            name='approval_plan_version',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='node',
            name='approval_proposed_digest',
            field=models.CharField(blank=True, max_length=71),
        ),
        migrations.AddField(
            model_name='node',
            name='approval_requests',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='node',
            name='approval_seq',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='node',
            name='approved_by',
            field=models.CharField(blank=True, max_length=220),
        ),
        migrations.AddConstraint(
            model_name='node',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('approval_digest', ''), ('approval_expires_at__isnull', True), ('approval_plan_version__isnull', True), ('approval_seq__isnull', True), ('approved_by', '')), models.Q(('approval_digest__regex', '^sha256:[0-9a-f]{64}$'), ('approval_expires_at__isnull', False), ('approval_plan_version__isnull', False), ('approval_seq__isnull', False), ('approved_by__startswith', 'user:'), ('status', 'succeeded')), _connector='OR'), name='node_approval_binding_whole'),
        ),
        migrations.AddConstraint(
            model_name='node',
            constraint=models.CheckConstraint(condition=models.Q(('approval_plan_version__isnull', True), ('approval_plan_version__lte', models.F('plan_version')), _connector='OR'), name='node_approval_not_ahead_of_its_plan'),
        ),
        migrations.AddConstraint(
            model_name='node',
            constraint=models.CheckConstraint(condition=models.Q(('approval_proposed_digest', ''), ('approval_proposed_digest__regex', '^sha256:[0-9a-f]{64}$'), _connector='OR'), name='node_approval_proposed_is_a_digest'),
        ),
        migrations.RunPython(create, drop),
    ]
