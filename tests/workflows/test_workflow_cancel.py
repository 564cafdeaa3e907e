"""Cancelling a workflow, or one step's job; and an enqueue rolled back with its caller."""

from __future__ import annotations

import pytest
from django.db import transaction

from alkstore_django import Workflow, operations, store
from alkstore_django.models import Job, WorkflowStep
from alkstore_django.models import Workflow as WorkflowRow
from tests.helpers import running_worker, wait_for
from tests.testapp.models import Run


def states(workflow_id: int) -> dict[str, str]:
    return {name: step.state for name, step in store.get_workflow(workflow_id).steps.items()}


def a_chain() -> Workflow:
    wf = Workflow("chain")
    wf.add("a", queue="t.wf")
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("c", queue="t.wf", after=["b"])
    wf.add("other", queue="t.record")
    return wf


@pytest.mark.django_db(transaction=True)
def test_cancel_workflow__cancels_waiting_and_pending_steps_and_a_running_ack_changes_nothing():
    wf = Workflow()
    wf.add("slow", queue="t.wf", payload={"sleep_s": 1.0})
    wf.add("after_slow", queue="t.wf", after=["slow"])
    wf.add("idle", queue="t.record")  # no worker for it: its job stays pending
    workflow_id = store.enqueue_workflow(wf)
    steps = store.get_workflow(workflow_id).steps
    slow_job, idle_job = steps["slow"].job_id, steps["idle"].job_id
    with running_worker(["t.wf"], concurrency=1) as worker:
        assert wait_for(lambda: Run.objects.filter(job_id=slow_job).exists(), timeout=10)
        assert states(workflow_id)["slow"] == "processing"
        assert store.cancel_workflow(workflow_id) is True
        workflow = store.get_workflow(workflow_id)
        assert workflow.state == "cancelled"
        assert workflow.finished_at is not None
        assert (workflow.steps_open, workflow.steps_done) == (0, 3)
        assert set(states(workflow_id).values()) == {"cancelled"}
        assert {s.error for s in workflow.steps.values()} == {
            "cancelled: the workflow was cancelled"
        }
        # The pending jobs are gone, the one under a claim too: its ack will find nothing.
        assert not Job.objects.filter(id__in=[slow_job, idle_job]).exists()
        assert store.cancel_workflow(workflow_id) is False
        assert wait_for(lambda: worker.stats.lost == 1, timeout=10)
    assert worker.stats.acked == 0
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "cancelled"
    assert set(states(workflow_id).values()) == {"cancelled"}
    assert workflow.steps["slow"].result is None
    assert workflow.steps["after_slow"].job_id is None
    assert list(Run.objects.values_list("job_id", flat=True)) == [slow_job]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_cancel_workflow__false_for_an_unknown_or_finished_workflow():
    assert store.cancel_workflow(987654) is False
    wf = Workflow()
    wf.add("only", queue="t.wf")
    workflow_id = store.enqueue_workflow(wf)
    job_id = store.get_workflow(workflow_id).steps["only"].job_id
    assert store.queue("t.wf").cancel(job_id) is True  # ends the workflow
    assert store.get_workflow(workflow_id).state == "cancelled"
    assert store.cancel_workflow(workflow_id) is False


@pytest.mark.django_db
def test_queue_cancel_of_a_steps_job__cancels_the_step_and_its_dependants():
    workflow_id = store.enqueue_workflow(a_chain())
    steps = store.get_workflow(workflow_id).steps
    assert store.queue("t.wf").cancel(steps["a"].job_id) is True
    workflow = store.get_workflow(workflow_id)
    assert states(workflow_id) == {
        "a": "cancelled",
        "b": "cancelled",
        "c": "cancelled",
        "other": "pending",
    }
    assert workflow.steps["a"].error == "cancelled: its job was cancelled"
    assert workflow.steps["b"].error == "cancelled: upstream step 'a' cancelled"
    assert workflow.steps["c"].error == "cancelled: upstream step 'b' cancelled"
    assert (workflow.state, workflow.steps_open) == ("running", 1)
    assert store.queue("t.wf").cancel(steps["a"].job_id) is False
    assert store.queue("t.record").cancel(steps["other"].job_id) is True
    workflow = store.get_workflow(workflow_id)
    # Nothing failed, something was cancelled: the workflow reads cancelled.
    assert (workflow.state, workflow.steps_open) == ("cancelled", 0)
    assert workflow.finished_at is not None


@pytest.mark.django_db
def test_cancel_jobs__cancels_steps_of_several_workflows_in_one_call():
    first, second = store.enqueue_workflow(a_chain()), store.enqueue_workflow(a_chain())
    ids = [store.get_workflow(w).steps["a"].job_id for w in (first, second)]
    plain = store.queue("t.record").enqueue({})
    assert operations.cancel_jobs([*ids, plain]) == 3
    for workflow_id in (first, second):
        assert states(workflow_id)["c"] == "cancelled"
        assert store.get_workflow(workflow_id).steps_open == 1


@pytest.mark.django_db
def test_queue_cancel_of_another_job_of_the_queue__does_not_touch_the_step():
    workflow_id = store.enqueue_workflow(a_chain())
    plain = store.queue("t.wf").enqueue({})
    assert store.queue("t.wf").cancel(plain) is True
    assert states(workflow_id)["a"] == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_workflow__leaves_no_workflow_step_or_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        workflow_id = store.enqueue_workflow(a_chain())
        assert WorkflowRow.objects.filter(id=workflow_id).exists()
        assert Job.objects.count() == 2
        raise RuntimeError("the caller's transaction fails")
    assert not WorkflowRow.objects.exists()
    assert not WorkflowStep.objects.exists()
    assert not Job.objects.exists()
    assert store.get_workflow(workflow_id) is None


@pytest.mark.django_db(transaction=True)
def test_enqueue_workflow_in_a_committed_atomic__is_claimable_after_the_commit():
    with transaction.atomic():
        workflow_id = store.enqueue_workflow(a_chain())
    with running_worker(["t.wf", "t.record"], concurrency=2):
        assert wait_for(lambda: store.get_workflow(workflow_id).state != "running", timeout=15)
    assert store.get_workflow(workflow_id).state == "succeeded"
