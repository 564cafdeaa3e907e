"""Steering running work: cancel requests, progress, concurrency keys, tags.

MariaDB/MySQL get ``alk_job_key`` unconditioned (``prepare_app_schema``).
"""

from django.db import migrations, models


def prepare(apps, schema_editor):
    from alkstore_django.dialects import prepare_app_schema

    prepare_app_schema(apps, schema_editor)


class Migration(migrations.Migration):
    # MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
    atomic = False

    dependencies = [
        ("alkstore_django", "0013_workflows_and_results"),
    ]

    operations = [
        migrations.AddField(
            model_name="deadjob",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="deadjob",
            name="tags",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="tags",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="jobresult",
            name="tags",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("concurrency_key__isnull", False), ("state", "pending")),
                fields=["queue", "concurrency_key", "-priority", "run_at", "id"],
                name="alk_job_key",
            ),
        ),
        migrations.AddField(
            model_name="queuecontrol",
            name="key_cursor",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.RunPython(prepare, migrations.RunPython.noop),
    ]
