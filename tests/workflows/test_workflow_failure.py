"""A step that dead-letters: its dependants are cancelled, clean-up steps run, a requeue resumes."""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from alkstore_django import Workflow, operations, store
from alkstore_django.models import DeadJob, Job
from alkstore_django.models import Workflow as WorkflowRow
from alkstore_django.worker import Worker
from alkstore_django.workflows.progress import prune_finished
from tests.helpers import make_due, running_worker, wait_for
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

FAILED_A = "ValueError: step a failed"


def drain() -> None:
    Worker(["t.wf"], burst=True, concurrency=4).run(threading.Event())


def states(workflow_id: int) -> dict[str, str]:
    return {name: step.state for name, step in store.get_workflow(workflow_id).steps.items()}


def runs_of(job_id: int) -> int:
    return Run.objects.filter(job_id=job_id).count()


def test_a_dead_step__cancels_its_dependants_transitively_and_the_workflow_fails():
    wf = Workflow("fails")
    wf.add("a", queue="t.wf", payload={"fail": True}, max_attempts=1)
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("c", queue="t.wf", after=["b"])
    wf.add("d", queue="t.wf", after=["a", "x"])
    wf.add("x", queue="t.wf")
    wf.add("y", queue="t.wf", after=["x"])
    workflow_id = store.enqueue_workflow(wf)
    drain()
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "failed"
    assert workflow.finished_at is not None
    assert (workflow.steps_open, workflow.steps_done) == (0, 6)
    steps = workflow.steps
    assert states(workflow_id) == {
        "a": "failed",
        "b": "cancelled",
        "c": "cancelled",
        "d": "cancelled",
        "x": "succeeded",
        "y": "succeeded",
    }
    assert steps["a"].error == FAILED_A
    assert steps["b"].error == "cancelled: upstream step 'a' failed"
    assert steps["c"].error == "cancelled: upstream step 'b' cancelled"
    assert steps["d"].error == "cancelled: upstream step 'a' failed"
    # The cancelled steps were never released: no job, no run.
    assert [steps[n].job_id for n in "bcd"] == [None, None, None]
    assert DeadJob.objects.get(id=steps["a"].job_id).last_error == FAILED_A
    assert runs_of(steps["a"].job_id) == 1
    assert steps["y"].result["seen"] == {"x": steps["x"].result}
    assert not Job.objects.exists()


def test_a_dead_step__the_workflow_stays_running_until_an_independent_branch_finishes():
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail": True}, max_attempts=1)
    # A diamond below it: d is reached through both b and c, and counted closed once.
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("c", queue="t.wf", after=["a"])
    wf.add("d", queue="t.wf", after=["b", "c"])
    wf.add("slow", queue="t.wf", payload={"sleep_s": 1.0})
    workflow_id = store.enqueue_workflow(wf)
    with running_worker(["t.wf"], concurrency=2):
        assert wait_for(lambda: states(workflow_id)["a"] == "failed", timeout=10)
        workflow = store.get_workflow(workflow_id)
        assert [workflow.steps[n].state for n in "bcd"] == ["cancelled"] * 3
        assert workflow.steps["slow"].state in ("pending", "processing")
        assert (workflow.state, workflow.finished_at, workflow.steps_open) == ("running", None, 1)
        assert wait_for(lambda: store.get_workflow(workflow_id).state != "running", timeout=10)
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "failed"
    assert workflow.steps["slow"].state == "succeeded"


def test_on_upstream_failure_run__runs_after_every_parent_finished_and_reads_their_states():
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail": True}, max_attempts=1)
    wf.add("b", queue="t.wf", payload={"sleep_s": 0.3})
    wf.add("cleanup", queue="t.wf", after=["a", "b"], on_upstream_failure="run")
    wf.add("after_cleanup", queue="t.wf", after=["cleanup"])
    workflow_id = store.enqueue_workflow(wf)
    drain()
    workflow = store.get_workflow(workflow_id)
    cleanup = workflow.steps["cleanup"]
    assert cleanup.run_on_upstream_failure is True
    assert cleanup.state == "succeeded"
    # What it saw when it ran: both parents finished, one failed, one with its result.
    assert cleanup.result["states"] == {"a": "failed", "b": "succeeded"}
    assert cleanup.result["seen"] == {"a": None, "b": workflow.steps["b"].result}
    assert runs_of(cleanup.job_id) == 1
    # Its own dependants run as usual: the clean-up succeeded.
    assert workflow.steps["after_cleanup"].state == "succeeded"
    assert workflow.state == "failed"


def test_on_upstream_failure_run__runs_after_a_parent_cancelled_by_a_failure_further_up():
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail": True}, max_attempts=1)
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("cleanup", queue="t.wf", after=["b"], on_upstream_failure="run")
    workflow_id = store.enqueue_workflow(wf)
    drain()
    workflow = store.get_workflow(workflow_id)
    assert states(workflow_id) == {"a": "failed", "b": "cancelled", "cleanup": "succeeded"}
    assert workflow.steps["cleanup"].result["states"] == {"b": "cancelled"}
    assert workflow.state == "failed"


def test_requeue_of_the_dead_step__resumes_it_and_its_cancelled_dependants_wait_again(tmp_path):
    gate = tmp_path / "still-failing"
    gate.touch()
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail_until_file": str(gate)}, max_attempts=1)
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("c", queue="t.wf", after=["b"])
    wf.add("x", queue="t.wf")
    workflow_id = store.enqueue_workflow(wf)
    drain()
    assert store.get_workflow(workflow_id).state == "failed"
    a_job = store.get_workflow(workflow_id).steps["a"].job_id
    gate.unlink()
    assert operations.requeue_dead([a_job]) == 1
    workflow = store.get_workflow(workflow_id)
    assert (workflow.state, workflow.finished_at, workflow.steps_open) == ("running", None, 3)
    assert states(workflow_id) == {
        "a": "pending",
        "b": "waiting",
        "c": "waiting",
        "x": "succeeded",
    }
    assert [workflow.steps[n].error for n in "abc"] == [None, None, None]
    assert workflow.steps["a"].job_id == a_job
    assert store.get_job(a_job).state == "pending"
    drain()
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "succeeded"
    assert set(states(workflow_id).values()) == {"succeeded"}
    assert workflow.steps["b"].result["seen"] == {"a": workflow.steps["a"].result}
    assert workflow.steps["c"].result["states"] == {"b": "succeeded"}
    assert runs_of(a_job) == 2
    assert not DeadJob.objects.exists()


def test_requeue_by_the_cli__resumes_the_workflow_and_leaves_a_clean_up_that_ran_as_it_ended(
    tmp_path,
):
    gate = tmp_path / "still-failing"
    gate.touch()
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail_until_file": str(gate)}, max_attempts=1)
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("cleanup", queue="t.wf", after=["a"], on_upstream_failure="run")
    workflow_id = store.enqueue_workflow(wf)
    drain()
    before = store.get_workflow(workflow_id)
    assert before.steps["cleanup"].state == "succeeded"
    gate.unlink()
    out = StringIO()
    a_job = before.steps["a"].job_id
    call_command("alkstore", "requeue", "--queue", "t.wf", "--id", str(a_job), stdout=out)
    assert "Requeued 1 dead letter(s)" in out.getvalue()
    assert states(workflow_id) == {"a": "pending", "b": "waiting", "cleanup": "succeeded"}
    drain()
    after = store.get_workflow(workflow_id)
    assert after.state == "succeeded"
    assert after.steps["cleanup"].result == before.steps["cleanup"].result
    assert runs_of(after.steps["cleanup"].job_id) == 1
    assert after.steps["b"].state == "succeeded"


def test_requeue_of_one_of_two_dead_parents__its_dependant_stays_cancelled_until_both_are(
    tmp_path,
):
    gates = {name: tmp_path / f"{name}-failing" for name in ("a1", "a2")}
    wf = Workflow()
    for name, gate in gates.items():
        gate.touch()
        wf.add(name, queue="t.wf", payload={"fail_until_file": str(gate)}, max_attempts=1)
    wf.add("join", queue="t.wf", after=["a1", "a2"])
    workflow_id = store.enqueue_workflow(wf)
    drain()
    steps = store.get_workflow(workflow_id).steps
    for gate in gates.values():
        gate.unlink()
    operations.requeue_dead([steps["a1"].job_id])
    assert states(workflow_id) == {"a1": "pending", "a2": "failed", "join": "cancelled"}
    drain()
    # a2 still failed: the workflow ends failed again, its join still cancelled.
    assert store.get_workflow(workflow_id).state == "failed"
    assert states(workflow_id) == {"a1": "succeeded", "a2": "failed", "join": "cancelled"}
    operations.requeue_dead([steps["a2"].job_id])
    assert states(workflow_id) == {"a1": "succeeded", "a2": "pending", "join": "waiting"}
    drain()
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "succeeded"
    assert workflow.steps["join"].result["states"] == {"a1": "succeeded", "a2": "succeeded"}
    assert WorkflowRow.objects.get(id=workflow_id).steps_open == 0


def test_a_step_retried_before_it_succeeds__does_not_fail_its_workflow(tmp_path):
    gate = tmp_path / "failing-once"
    gate.touch()
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail_until_file": str(gate)}, max_attempts=3)
    wf.add("b", queue="t.wf", after=["a"])
    workflow_id = store.enqueue_workflow(wf)
    a_job = store.get_workflow(workflow_id).steps["a"].job_id
    drain()
    job = store.get_job(a_job)
    assert (job.state, job.attempts, job.last_error) == ("pending", 1, FAILED_A)
    assert states(workflow_id) == {"a": "pending", "b": "waiting"}
    gate.unlink()
    make_due(a_job)
    drain()
    assert store.get_workflow(workflow_id).state == "succeeded"
    assert list(Run.objects.filter(job_id=a_job).values_list("attempt", flat=True)) == [1, 2]


def test_requeue_of_a_step_whose_workflow_was_pruned__runs_it_as_a_plain_job(tmp_path):
    gate = tmp_path / "still-failing"
    gate.touch()
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail_until_file": str(gate)}, max_attempts=1)
    workflow_id = store.enqueue_workflow(wf)
    drain()
    a_job = store.get_workflow(workflow_id).steps["a"].job_id
    with override_settings(ALKSTORE={**settings.ALKSTORE, "WORKFLOW_RETENTION_S": 0}):
        assert prune_finished(store) == 1
    assert store.get_workflow(workflow_id) is None
    gate.unlink()
    assert operations.requeue_dead([a_job]) == 1
    worker = Worker(["t.wf"], burst=True)
    worker.run(threading.Event())
    # Its ack has no step to finish: the job is acked like any other, not failed for it.
    assert (worker.stats.acked, worker.stats.retried) == (1, 0)
    assert store.get_job(a_job) is None
    assert not DeadJob.objects.exists()


def test_requeue_of_a_failed_step_of_a_cancelled_workflow__runs_it_and_the_workflow_stays_so(
    tmp_path,
):
    gate = tmp_path / "still-failing"
    gate.touch()
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"fail_until_file": str(gate)}, max_attempts=1)
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("idle", queue="t.record")  # keeps the workflow running after a fails
    workflow_id = store.enqueue_workflow(wf)
    drain()
    assert store.get_workflow(workflow_id).state == "running"
    assert store.cancel_workflow(workflow_id) is True
    gate.unlink()
    a_job = store.get_workflow(workflow_id).steps["a"].job_id
    assert operations.requeue_dead([a_job]) == 1
    assert states(workflow_id) == {"a": "failed", "b": "cancelled", "idle": "cancelled"}
    drain()
    assert store.get_job(a_job) is None
    assert runs_of(a_job) == 2
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "cancelled"
    assert states(workflow_id) == {"a": "failed", "b": "cancelled", "idle": "cancelled"}
    assert workflow.steps["b"].job_id is None


def test_a_step_returning_a_value_that_is_not_json__fails_its_attempts_then_the_step():
    wf = Workflow()
    wf.add("a", queue="t.wf", payload={"bad_return": True}, max_attempts=1)
    wf.add("b", queue="t.wf", after=["a"])
    workflow_id = store.enqueue_workflow(wf)
    drain()
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "failed"
    error = workflow.steps["a"].error
    assert error.startswith("the ack outcome could not be recorded: PayloadError: Return value")
    assert workflow.steps["a"].result is None
    assert workflow.steps["b"].state == "cancelled"


def test_a_step_snoozed_past_its_cap__fails_with_its_dead_letters_error():
    wf = Workflow()
    wf.add("wait", queue="t.snooze", payload={"times": 10})
    wf.add("after", queue="t.wf", after=["wait"])
    with override_settings(ALKSTORE={"QUEUES": {"t.snooze": {"max_snoozes": 1}}}):
        workflow_id = store.enqueue_workflow(wf)
        Worker(["t.snooze"], burst=True).run(threading.Event())
    workflow = store.get_workflow(workflow_id)
    wait = workflow.steps["wait"]
    assert wait.state == "failed"
    assert (
        wait.error
        == store.get_job(wait.job_id).last_error
        == ("snoozed 1 times: its max_snoozes is 1")
    )
    assert workflow.steps["after"].state == "cancelled"
    assert workflow.state == "failed"
