"""The queue controls table (pause, rate window); MariaDB/MySQL give it their exact collation."""

from django.db import migrations, models


def prepare(apps, schema_editor):
    from alkstore_django.dialects import prepare_app_schema

    prepare_app_schema(apps, schema_editor)


class Migration(migrations.Migration):
    # MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
    atomic = False

    dependencies = [
        ("alkstore_django", "0011_unique_jobs"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueueControl",
            fields=[
                (
                    "queue",
                    models.CharField(max_length=200, primary_key=True, serialize=False),
                ),
                ("paused", models.BooleanField(db_default=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("window_at", models.DateTimeField(blank=True, null=True)),
                ("window_starts", models.PositiveIntegerField(db_default=0)),
            ],
            options={
                "verbose_name": "queue control",
            },
        ),
        migrations.RunPython(prepare, migrations.RunPython.noop),
    ]
