"""A fan-in whose 50 parents two worker processes finish at once: it is released and run once.

The release of a step commits with the ack of the last parent it waited on,
under the workflow's row lock, so two acks committing together cannot both
see the count reach zero (nor both miss it).
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from alkstore_django import Workflow, store
from alkstore_django.models import Job, LiveWorker
from tests.helpers import runworker, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PARENTS = 50
WORKERS = ("fan-a", "fan-b")


def test_two_worker_processes_finishing_50_parents__release_and_run_the_join_exactly_once(
    subprocess_env,
):
    args = ("--queue", "t.wf", "--concurrency", "4")
    procs = [runworker(subprocess_env, *args, "--worker-id", name, wait=False) for name in WORKERS]
    try:
        # Both up before there is any work: each gets its share of the parents.
        assert wait_for(lambda: LiveWorker.objects.count() == len(WORKERS), timeout=60)
        wf = Workflow("fan-in")
        wf.add("start", queue="t.wf")
        for n in range(PARENTS):
            wf.add(f"p{n}", queue="t.wf", payload={"sleep_s": 0.05}, after=["start"])
        wf.add("join", queue="t.wf", after=[f"p{n}" for n in range(PARENTS)])
        workflow_id = store.enqueue_workflow(wf)
        assert wait_for(lambda: store.get_workflow(workflow_id).state != "running", timeout=60)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outs = [proc.communicate(timeout=30)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "succeeded", outs
    join = workflow.steps["join"]
    parents = {workflow.steps[f"p{n}"].job_id for n in range(PARENTS)}
    runs = list(Run.objects.values_list("job_id", "worker_id"))
    # One run per step, and no job but the steps' (a second join would be one more).
    assert Counter(job_id for job_id, _ in runs) == {s.job_id: 1 for s in workflow.steps.values()}
    assert len(runs) == PARENTS + 2
    assert join.job_id not in parents
    assert sorted(join.result["seen"]) == sorted(f"p{n}" for n in range(PARENTS))
    # Both processes finished parents: the acks raced.
    by_worker = Counter(worker for job_id, worker in runs if job_id in parents)
    assert set(by_worker) == set(WORKERS), by_worker
    assert sum(out.count(f"id={join.job_id} ") for out in outs) == 1
    assert not Job.objects.exists()
