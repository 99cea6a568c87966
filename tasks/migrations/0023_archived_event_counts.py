# The archive keeps its count of events by type (tasks/engine/archive.py), for the metrics.


from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0022_event_archive'),
    ]

    operations = [
        migrations.CreateModel(
            name='ArchivedEventCount',
            fields=[
                ('type', models.CharField(max_length=50, primary_key=True, serialize=False)),
                ('events', models.PositiveBigIntegerField()),
            ],
        ),
    ]
