"""The kept results: what became of jobs enqueued with ``keep_result_s``, until they expire.

Read-only: a result is written in the transaction of its job's ack, dead-letter
move or cancel, and deleted by the workers' upkeep once expired (or when its
dead letter is requeued). ``kept_result`` shows one on the dead letter's page.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ..conf import app_settings
from ..display import format_timestamp
from ..models import DeadJob, Job, JobResult
from .base import AlkstoreModelAdmin, JobIdSearchMixin, TagFilter, TagsMixin, job_link
from .base import pre as _pre


def value_text(value: Any) -> str:
    """Return a result's value as indented JSON text (``null`` when it returned None)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def kept_result(job: Job | DeadJob) -> str:
    """Return the kept result of ``job`` as HTML: state, times, value or error, its page linked.

    ``not kept`` when the job was enqueued without ``keep_result_s``; a job
    that keeps one but has none yet (or whose result expired) says so.
    """
    row = JobResult.objects.using(app_settings.database).filter(job_id=job.pk).first()
    if row is None:
        if job.keep_result_s is None:
            return "not kept (enqueued without keep_result_s)"
        return f"none (kept {job.keep_result_s:g} s after the job ends; expired or not ended yet)"
    summary = (
        f"{row.state} at {format_timestamp(row.finished_at)} after {row.attempts} attempt(s), "
        f"kept until {format_timestamp(row.expires_at)}"
    )
    url = reverse("admin:alkstore_django_jobresult_change", args=[row.pk])
    summary = format_html('<a href="{}">{}</a>', url, summary)
    body = value_text(row.value) if row.state == "succeeded" else (row.error or "")
    return format_html('<div class="alk-kept-result">{}{}</div>', summary, _pre(body))


@admin.register(JobResult)
class JobResultAdmin(TagsMixin, JobIdSearchMixin, AlkstoreModelAdmin):
    """Read-only: results are written by the job's outcome and pruned by the upkeep."""

    list_display = (
        "job_id", "queue", "state", "attempts", "finished_at", "expires_at", "tag_list",
    )  # fmt: skip
    list_filter = ("state", "queue", TagFilter)
    search_fields = ("error",)
    search_help_text = "Error text, a job id, or tag:TAG (a lone tag matches too)."
    # The primary key: newest jobs first without a sort over the whole table.
    ordering = ("-job_id",)
    list_per_page = 50
    show_full_result_count = False
    fields = (
        "job_id",
        "job",
        "queue",
        "state",
        "attempts",
        "tag_list",
        "value_pretty",
        "error_full",
        "finished_at",
        "expires_at",
    )
    readonly_fields = fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Results leave when they expire (the workers' upkeep).
        return False

    @admin.display(description="job")
    def job(self, obj: JobResult) -> str:
        """Link to the job while it is live or a dead letter (same id)."""
        return job_link(obj.job_id, "gone (acked, cancelled, or dead letter deleted)")

    @admin.display(description="value")
    def value_pretty(self, obj: JobResult) -> str:
        return _pre(value_text(obj.value)) if obj.state == "succeeded" else "-"

    @admin.display(description="error")
    def error_full(self, obj: JobResult) -> str:
        return _pre(obj.error) if obj.error else "-"
