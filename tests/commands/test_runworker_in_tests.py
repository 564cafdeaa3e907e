"""``runworker`` inside a test's transaction: refused at once, naming the helper that works."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from alkstore_django import store
from alkstore_django.models import Job
from alkstore_django.testing import run_ready_jobs
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]


def test_runworker_burst_in_a_test_transaction__is_refused_naming_run_ready_jobs():
    job_id = store.queue("t.record").enqueue("p")
    with pytest.raises(CommandError, match=r"alkstore_django\.testing\.run_ready_jobs\(\)"):
        call_command("runworker", "--burst", "--queue", "t.record")
    # Nothing was claimed: the helper the message names runs the job.
    assert Job.objects.filter(id=job_id, worker_id__isnull=True).exists()
    assert [run.outcome for run in run_ready_jobs(["t.record"])] == ["acked"]
    assert Run.objects.filter(job_id=job_id).exists()
