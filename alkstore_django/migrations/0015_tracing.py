"""Tracing: the trace context of a job's enqueue, kept on the job, its dead letter, its workflow.

Nullable text, written by the enqueue's own insert: NULL when no tracer
provider is set (``alkstore_django.tracing``).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("alkstore_django", "0014_steering"),
    ]

    operations = [
        migrations.AddField(
            model_name="deadjob",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflow",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
    ]
