"""Workflows and their steps, kept job results, and the job columns that point at them.

MariaDB/MySQL give the new tables their exact collation (``prepare_app_schema``).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


def prepare(apps, schema_editor):
    from alkstore_django.dialects import prepare_app_schema

    prepare_app_schema(apps, schema_editor)


class Migration(migrations.Migration):
    # MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
    atomic = False

    dependencies = [
        ("alkstore_django", "0012_queue_controls"),
    ]

    operations = [
        migrations.AddField(
            model_name="deadjob",
            name="keep_result_s",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="deadjob",
            name="step",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="deadjob",
            name="workflow_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="keep_result_s",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="step",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="workflow_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="JobResult",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=200)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("succeeded", "succeeded"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ],
                        max_length=16,
                    ),
                ),
                ("value", models.JSONField(blank=True, null=True)),
                ("error", models.TextField(blank=True, null=True)),
                ("attempts", models.PositiveIntegerField()),
                ("finished_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "job result",
                "indexes": [models.Index(fields=["expires_at"], name="alk_result_expiry")],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("state__in", ["succeeded", "failed", "cancelled"])),
                        name="alk_result_state",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(blank=True, default="", max_length=200)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("running", "running"),
                            ("succeeded", "succeeded"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ],
                        default="running",
                        max_length=16,
                    ),
                ),
                ("steps_total", models.PositiveIntegerField()),
                ("steps_open", models.PositiveIntegerField()),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["state", "-id"], name="alk_workflow_state"),
                    models.Index(fields=["finished_at"], name="alk_workflow_finished"),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("state__in", ["running", "succeeded", "failed", "cancelled"])
                        ),
                        name="alk_workflow_state_valid",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowStep",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("queue", models.CharField(max_length=200)),
                ("payload", models.TextField()),
                ("options", models.JSONField(default=dict)),
                ("after", models.JSONField(default=list)),
                ("dependants", models.JSONField(default=list)),
                ("run_on_upstream_failure", models.BooleanField(default=False)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("waiting", "waiting"),
                            ("pending", "pending"),
                            ("succeeded", "succeeded"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ],
                        max_length=16,
                    ),
                ),
                ("blocked_by", models.PositiveIntegerField()),
                ("upstream_failed", models.BooleanField(default=False)),
                ("job_id", models.BigIntegerField(blank=True, null=True)),
                ("result", models.JSONField(blank=True, null=True)),
                ("error", models.TextField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "workflow",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="alkstore_django.workflow",
                    ),
                ),
            ],
            options={
                "verbose_name": "workflow step",
                "indexes": [
                    models.Index(fields=["job_id"], name="alk_step_job"),
                    models.Index(fields=["state", "workflow"], name="alk_step_state_wf"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("workflow", "name"), name="alk_step_name"),
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "state__in",
                                ["waiting", "pending", "succeeded", "failed", "cancelled"],
                            )
                        ),
                        name="alk_step_state",
                    ),
                ],
            },
        ),
        migrations.RunPython(prepare, migrations.RunPython.noop),
    ]
