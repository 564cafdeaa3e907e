"""A worker SIGKILLed in the middle of a workflow: the workflow completes, nothing lost or doubled.

The whole process group goes (worker and sentinel), so nothing settles the
jobs it held: their claims lapse (a short ``visibility_timeout_s`` for the
queue, in the test process and the workers alike) and the next worker claims
them again, at their next attempt. A step whose ack committed before the kill
has released its dependants in that same transaction; one whose ack did not
runs again. So every step succeeds, and no attempt of a job runs twice.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from alkstore_django import Workflow, store
from alkstore_django.models import DeadJob, Job
from tests.helpers import runworker, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PARTS = 16
SHORT_CLAIMS = {"QUEUES": {"t.wf": {"visibility_timeout_s": 2}}}


def a_chain_and_fan_out() -> Workflow:
    """extract → 16 parts (each a little work) → join → notify: 19 steps."""
    wf = Workflow("killed")
    wf.add("extract", queue="t.wf")
    for n in range(PARTS):
        wf.add(f"part{n}", queue="t.wf", payload={"sleep_s": 0.4}, after=["extract"])
    wf.add("join", queue="t.wf", after=[f"part{n}" for n in range(PARTS)])
    wf.add("notify", queue="t.wf", after=["join"])
    return wf


def counts(workflow_id: int) -> Counter[str]:
    return Counter(s.state for s in store.get_workflow(workflow_id).steps.values())


def test_a_worker_killed_mid_workflow__the_next_one_completes_it_with_no_attempt_run_twice(
    settings_variant,
):
    env = settings_variant(f"ALKSTORE = {{**ALKSTORE, **{SHORT_CLAIMS!r}}}")
    with override_settings(ALKSTORE={**django_settings.ALKSTORE, **SHORT_CLAIMS}):
        workflow_id = store.enqueue_workflow(a_chain_and_fan_out())
        first = store.get_workflow(workflow_id).steps["extract"].job_id
        assert store.get_job(first).visibility_timeout_s == 2
        victim = runworker(
            env, "--queue", "t.wf", "--concurrency", "4", wait=False, new_session=True
        )
        try:
            # Some steps done, others under the worker's claims: the middle of the workflow.
            assert wait_for(
                lambda: (c := counts(workflow_id))["succeeded"] >= 3 and c["processing"] >= 2,
                timeout=60,
            ), counts(workflow_id)
        finally:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.communicate(timeout=10)
        at_kill = counts(workflow_id)
        assert at_kill["succeeded"] < len(a_chain_and_fan_out().steps), at_kill
        assert Job.objects.filter(state="processing").exists()
        rescuer = runworker(env, "--queue", "t.wf", "--concurrency", "4", wait=False)
        try:
            finished = wait_for(
                lambda: store.get_workflow(workflow_id).state != "running", timeout=60
            )
        finally:
            rescuer.send_signal(signal.SIGTERM)
            out, _ = rescuer.communicate(timeout=30)
    assert finished, (counts(workflow_id), out)
    assert rescuer.returncode == 0, out
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "succeeded", out
    assert set(counts(workflow_id)) == {"succeeded"}
    assert sorted(workflow.steps["join"].result["seen"]) == sorted(f"part{n}" for n in range(PARTS))
    runs = Counter(Run.objects.values_list("job_id", "attempt"))
    assert set(runs.values()) == {1}, [key for key, n in runs.items() if n > 1]
    # Every step's job ran, each to a success; the reruns are the killed worker's claims.
    step_jobs = {s.job_id for s in workflow.steps.values()}
    assert {job_id for job_id, _ in runs} == step_jobs
    assert any(attempt > 1 for _, attempt in runs)
    assert not Job.objects.exists()
    assert not DeadJob.objects.exists()
