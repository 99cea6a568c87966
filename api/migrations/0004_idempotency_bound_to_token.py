"""An Idempotency-Key's stored answer is bound to the token that made it (issue 25): a replay goes to that token
only, never to another token of the same agent.

The records written before were bound to an agent only. Each is kept bound to its agent's token when that agent
has exactly one token (it can only have been that one's); the others cannot be bound to the token that made them,
and are forgotten: a request retried with such a key runs as a new one (checked like any other). Keys are kept 24
hours, so this touches at most a day's retries of agents that hold several tokens."""

import django.db.models.deletion
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def bind(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    ApiToken = apps.get_model("api", "ApiToken")
    IdempotencyRecord = apps.get_model("api", "IdempotencyRecord")
    for agent_id in IdempotencyRecord.objects.values_list("agent_id", flat=True).distinct():
        tokens = list(ApiToken.objects.filter(agent_id=agent_id).values_list("pk", flat=True)[:2])
        records = IdempotencyRecord.objects.filter(agent_id=agent_id)
        if len(tokens) == 1:
            records.update(token_id=tokens[0])
        else:
            records.delete()


class Migration(migrations.Migration):
    dependencies = [("api", "0003_token_changes_captured")]

    operations = [
        migrations.RemoveConstraint(model_name="idempotencyrecord", name="idempotency_key_unique_per_agent"),
        migrations.AddField(
            model_name="idempotencyrecord",
            name="token",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="api.apitoken"
            ),
        ),
        migrations.RunPython(bind, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="idempotencyrecord",
            name="token",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="api.apitoken"),
        ),
        migrations.AddConstraint(
            model_name="idempotencyrecord",
            constraint=models.UniqueConstraint(fields=("token", "key"), name="idempotency_key_unique_per_token"),
        ),
    ]
