"""The URL's scheme in lower case, checked exactly on both databases (issue 25: an upper-case scheme passed the SQLite
CHECK and failed PostgreSQL's with a 500). Rows stored before are case-folded first, so the new CHECK holds."""

from typing import Any

import django.db.models.functions.text
import django.db.models.lookups
from django.db import migrations, models


def lower_case_schemes(apps: Any, schema_editor: Any) -> None:
    subscription = apps.get_model("hooks", "WebhookSubscription")
    for row in subscription.objects.using(schema_editor.connection.alias).only("pk", "url"):
        scheme, sep, rest = row.url.partition("://")
        if sep and scheme != scheme.lower():
            subscription.objects.using(schema_editor.connection.alias).filter(pk=row.pk).update(
                url=scheme.lower() + sep + rest
            )


class Migration(migrations.Migration):
    dependencies = [("hooks", "0001_initial")]

    operations = [
        migrations.RemoveConstraint(model_name="webhooksubscription", name="webhook_subscription_url_http"),
        migrations.RunPython(lower_case_schemes, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="webhooksubscription",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    django.db.models.lookups.Exact(django.db.models.functions.text.Left("url", 8), "https://")
                )
                | models.Q(django.db.models.lookups.Exact(django.db.models.functions.text.Left("url", 7), "http://")),
                name="webhook_subscription_url_scheme",
            ),
        ),
    ]
