"""The queue controls table (pause, rate window); MariaDB/MySQL give it their exact collation."""

from django.db import migrations, models


def prepare(apps, schema_editor):
    from alkstore_django.dialects import prepare_schema

    prepare_schema(
        schema_editor, [apps.get_model("alkstore_django", "QueueControl")._meta.db_table]
    )


class Migration(migrations.Migration):
    # MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
    atomic = False

    dependencies = [
        ("alkstore_django", "0010_schedule_specs"),
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
