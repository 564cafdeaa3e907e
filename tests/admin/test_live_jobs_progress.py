"""The live jobs' progress: a bar with done/total and the note, on the list and the job's page.

The progress is written as a worker writes it: by the claim's heartbeat.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from alkstore_django import store

pytestmark = pytest.mark.django_db


def claimed_with_progress(progress: dict) -> int:
    """Claim a job of ``live.p`` and write ``progress`` with its heartbeat; return its id."""
    queue = store.queue("live.p")
    queue.enqueue({})
    handle = queue.claim_one("worker-p")
    assert handle.heartbeat(30, progress)
    return handle.job.id


def test_live_jobs__list_and_page_show_a_bar_done_of_total_and_the_escaped_note(admin_client):
    job_id = claimed_with_progress({"done": 400, "total": 1000, "note": "<b>rows</b>"})
    listed = admin_client.get(reverse("admin:alkstore_django_job_changelist")).content.decode()
    page = admin_client.get(
        reverse("admin:alkstore_django_job_change", args=[job_id])
    ).content.decode()
    for html in (listed, page):
        assert '<progress value="40" max="100"' in html
        assert "400/1000 (40%)" in html
        assert "&lt;b&gt;rows&lt;/b&gt;" in html
        assert "<b>rows</b>" not in html
    assert store.get_job(job_id).progress.note == "<b>rows</b>"


def test_live_jobs__an_unknown_total_draws_an_indeterminate_bar(admin_client):
    job_id = claimed_with_progress({"done": 7, "total": None, "note": None})
    page = admin_client.get(
        reverse("admin:alkstore_django_job_change", args=[job_id])
    ).content.decode()
    assert '<progress title="reported ' in page
    assert "</progress> 7 done" in page


def test_live_jobs__done_past_the_total_fills_the_bar_and_no_more(admin_client):
    job_id = claimed_with_progress({"done": 12, "total": 10, "note": None})
    page = admin_client.get(
        reverse("admin:alkstore_django_job_change", args=[job_id])
    ).content.decode()
    assert '<progress value="100" max="100"' in page
    assert "12/10 (100%)" in page
