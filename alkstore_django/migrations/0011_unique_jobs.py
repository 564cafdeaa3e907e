"""Unique jobs: a job's optional unique key, and the windows that hold a key past success.

On MariaDB/MySQL, which have no partial indexes, the engine hook adds
``alk_job_unique`` unconditioned and gives the new table the exact collation.
"""

from django.db import migrations, models


def prepare(apps, schema_editor):
    from alkstore_django.dialects import prepare_app_schema

    prepare_app_schema(apps, schema_editor)


def unprepare(apps, schema_editor):
    from alkstore_django.dialects import unprepare_app_schema

    unprepare_app_schema(apps, schema_editor)


class Migration(migrations.Migration):
    # MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
    atomic = False

    dependencies = [
        ("alkstore_django", "0010_schedule_specs"),
    ]

    operations = [
        migrations.CreateModel(
            name="UniqueWindow",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("queue", models.CharField(max_length=200)),
                ("unique_key", models.CharField(max_length=200)),
                ("job_id", models.BigIntegerField()),
                ("held_until", models.DateTimeField()),
            ],
        ),
        migrations.AddField(
            model_name="deadjob",
            name="unique_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("unique_key__isnull", False)),
                fields=("queue", "unique_key"),
                name="alk_job_unique",
            ),
        ),
        migrations.AddIndex(
            model_name="uniquewindow",
            index=models.Index(fields=["queue", "held_until"], name="alk_unique_window_until"),
        ),
        migrations.AddIndex(
            model_name="uniquewindow",
            index=models.Index(fields=["job_id"], name="alk_unique_window_job"),
        ),
        migrations.AddConstraint(
            model_name="uniquewindow",
            constraint=models.UniqueConstraint(
                fields=("queue", "unique_key"), name="alk_unique_window"
            ),
        ),
        migrations.RunPython(prepare, unprepare),
    ]
