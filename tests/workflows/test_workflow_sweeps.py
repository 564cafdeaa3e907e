"""Steps whose job left by a sweep, not by an outcome: the upkeep chore settles them."""

from __future__ import annotations

import threading

import pytest

from alkstore_django import Workflow, operations, store
from alkstore_django.models import DeadJob, Job
from alkstore_django.worker import Worker
from alkstore_django.workflows.progress import settle_orphans
from tests.helpers import expire_job, lapse_claim


def states(workflow_id: int) -> dict[str, str]:
    return {name: step.state for name, step in store.get_workflow(workflow_id).steps.items()}


def two_steps(queue: str = "t.wf", **options) -> tuple[int, int]:
    """Enqueue ``a`` (with ``options``) → ``b``; return the workflow id and ``a``'s job id."""
    wf = Workflow()
    wf.add("a", queue=queue, **options)
    wf.add("b", queue="t.wf", after=["a"])
    workflow_id = store.enqueue_workflow(wf)
    return workflow_id, store.get_workflow(workflow_id).steps["a"].job_id


@pytest.mark.django_db
def test_an_expired_step__is_failed_by_the_settle_chore_and_its_dependants_cancelled():
    workflow_id, job_id = two_steps(expires_s=60)
    expire_job(job_id)
    assert store.queue("t.wf").sweep_expired().expired == 1
    # The sweep moved the job alone; the step waits for the chore.
    assert states(workflow_id) == {"a": "pending", "b": "waiting"}
    assert settle_orphans(store) == 1
    workflow = store.get_workflow(workflow_id)
    assert states(workflow_id) == {"a": "failed", "b": "cancelled"}
    assert workflow.steps["a"].error == "expired"
    assert workflow.steps["b"].error == "cancelled: upstream step 'a' failed"
    assert (workflow.state, workflow.steps_open) == ("failed", 0)
    assert settle_orphans(store) == 0
    assert DeadJob.objects.filter(id=job_id).exists()


@pytest.mark.django_db
def test_an_expired_step_requeued__runs_and_the_workflow_succeeds():
    from alkstore_django.testing import run_ready_jobs

    workflow_id, job_id = two_steps(expires_s=60)
    expire_job(job_id)
    store.queue("t.wf").sweep_expired()
    settle_orphans(store)
    assert operations.requeue_dead([job_id]) == 1
    assert states(workflow_id) == {"a": "pending", "b": "waiting"}
    run_ready_jobs(["t.wf"])
    assert store.get_workflow(workflow_id).state == "succeeded"


@pytest.mark.django_db
def test_an_exhausted_lapsed_claim__is_buried_by_a_claim_then_settled_as_failed():
    workflow_id, job_id = two_steps(max_attempts=1)
    queue = store.queue("t.wf")
    handle = queue.claim_one("w-dead")
    assert handle.job.id == job_id
    lapse_claim(job_id)
    assert queue.claim_one("w-next") is None  # the claim buried it first
    assert DeadJob.objects.get(id=job_id).last_error == "max attempts exceeded"
    assert states(workflow_id)["a"] == "pending"
    assert settle_orphans(store) == 1
    workflow = store.get_workflow(workflow_id)
    assert states(workflow_id) == {"a": "failed", "b": "cancelled"}
    assert workflow.steps["a"].error == "max attempts exceeded"
    assert workflow.state == "failed"
    # The dead worker's late ack finds its claim gone and changes nothing.
    assert handle.ack() is False
    assert states(workflow_id) == {"a": "failed", "b": "cancelled"}


@pytest.mark.django_db
def test_a_steps_job_deleted_behind_the_queues_back__settles_as_cancelled():
    workflow_id, job_id = two_steps()
    Job.objects.filter(id=job_id).delete()
    assert settle_orphans(store) == 1
    workflow = store.get_workflow(workflow_id)
    assert states(workflow_id) == {"a": "cancelled", "b": "cancelled"}
    assert workflow.steps["a"].error == "cancelled: its job was cancelled"
    assert workflow.state == "cancelled"


@pytest.mark.django_db
def test_settle_orphans__leaves_steps_whose_job_is_live_alone():
    workflow_id, job_id = two_steps()
    assert store.queue("t.wf").claim_one("w").job.id == job_id
    assert settle_orphans(store) == 0
    assert states(workflow_id) == {"a": "processing", "b": "waiting"}


@pytest.mark.django_db(transaction=True)
def test_a_worker_run__settles_expired_steps_and_exhausted_lapsed_claims_of_any_queue():
    expired_wf, expired_job = two_steps(expires_s=60)
    expire_job(expired_job)
    # A queue this worker does not serve: its lapsed claim is buried by the worker's upkeep.
    lapsed_wf, lapsed_job = two_steps(queue="t.record", max_attempts=1)
    assert store.queue("t.record").claim_one("w-dead").job.id == lapsed_job
    lapse_claim(lapsed_job)
    Worker(["t.wf"], burst=True, concurrency=1).run(threading.Event())
    assert states(expired_wf) == {"a": "failed", "b": "cancelled"}
    assert states(lapsed_wf) == {"a": "failed", "b": "cancelled"}
    assert store.get_workflow(expired_wf).state == "failed"
    assert store.get_workflow(lapsed_wf).steps["a"].error == "max attempts exceeded"
    assert not Job.objects.exists()
