"""Scenario 5: a worker whose clock is an hour ahead claims nothing early and steals nothing.

The worker runs under ``tests.chaos.skewed`` (its ``time.time`` and
``timezone.now`` an hour ahead). Jobs due in ten minutes, a live claim held
for ten minutes by another worker, and jobs expiring in twenty minutes are all
"in the past" by its clock; by the database's clock they are not, and the
database's clock is the only one the queue reads. Both engines.
"""

from __future__ import annotations

import time

import pytest

from alkstore_django import store
from alkstore_django.models import DeadJob, Job
from tests.chaos.harness import account, settle
from tests.helpers import VENDOR, db_now, wait_for
from tests.testapp.models import ChaosRun

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

SKEW_S = 3600


@pytest.mark.timeout(120)
def test_clock_an_hour_ahead__claims_nothing_early_and_steals_no_live_claim(fleet, report):
    started = time.monotonic()
    queue = store.queue("chaos.work", visibility_timeout_s=600, max_attempts=5)
    held_id = queue.enqueue({"work_ms": 0})
    holder = queue.claim_one("holder")
    assert holder is not None and holder.job.id == held_id
    early = queue.enqueue_many([{"work_ms": 0}] * 5, delay_s=600, expires_s=1200)
    due = queue.enqueue_many([{"work_ms": 0}] * 20, expires_s=1200)
    worker = fleet.start_worker(
        "skew-w", ["chaos.work"], launcher=("-m", "tests.chaos.skewed", str(SKEW_S))
    )
    assert wait_for(lambda: not Job.objects.filter(id__in=due).exists(), 60), fleet.tail()
    # Several polls, a wake-up for the "due" delayed jobs and a sweep happen meanwhile.
    time.sleep(3.0)
    assert "swept" not in worker.log()
    early_rows = list(Job.objects.filter(id__in=early).values_list("state", "attempts"))
    assert early_rows == [("pending", 0)] * 5
    held = Job.objects.get(id=held_id)
    assert (held.state, held.worker_id, held.attempts) == ("processing", "holder", 1)
    assert not DeadJob.objects.exists()
    # The worker really did live an hour ahead: its handler stamped the runs so.
    ahead_s = (ChaosRun.objects.earliest("created_at").created_at - db_now()).total_seconds()
    assert ahead_s > SKEW_S - 600, ahead_s
    assert holder.ack()
    fleet.stop_all_cleanly()
    figures = account("5 clock an hour ahead", VENDOR, due, fleet)
    figures.notes = {"early_untouched": len(early), "live_claim_kept": 1, "skew_s": SKEW_S}
    settle(figures, fleet, started, report)
    assert figures.acked == len(due)
    assert figures.double_run == 0
