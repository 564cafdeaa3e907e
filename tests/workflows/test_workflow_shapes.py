"""Workflows run by a real worker: chain, fan-out, fan-in, diamond, and what a step reads."""

from __future__ import annotations

import threading

import pytest

from alkstore_django import Workflow, store
from alkstore_django.models import Job, WorkflowStep
from alkstore_django.models import Workflow as WorkflowRow
from alkstore_django.worker import Worker
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> None:
    Worker(["t.wf"], burst=True, concurrency=4).run(threading.Event())


def runs_per_job() -> dict[int, int]:
    counts: dict[int, int] = {}
    for job_id in Run.objects.filter(queue="t.wf").values_list("job_id", flat=True):
        counts[job_id] = counts.get(job_id, 0) + 1
    return counts


def test_a_chain__runs_each_step_after_the_one_before_and_each_reads_its_parent():
    wf = Workflow("chain")
    wf.add("a", queue="t.wf")
    wf.add("b", queue="t.wf", after=["a"])
    wf.add("c", queue="t.wf", after=["b"])
    workflow_id = store.enqueue_workflow(wf)
    assert store.get_workflow(workflow_id).steps["b"].state == "waiting"
    assert Job.objects.count() == 1  # only the first step is a job yet
    drain()
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "succeeded"
    assert workflow.finished_at is not None
    assert workflow.steps_done == 3
    assert {s.state for s in workflow.steps.values()} == {"succeeded"}
    assert workflow.steps["c"].result["seen"] == {"b": workflow.steps["b"].result}
    assert workflow.steps["b"].result["seen"]["a"]["step"] == "a"
    assert workflow.steps["a"].result["workflow_id"] == workflow_id
    started = {
        name: Run.objects.get(job_id=step.job_id).created_at
        for name, step in workflow.steps.items()
    }
    assert started["a"] <= started["b"] <= started["c"]
    assert set(runs_per_job().values()) == {1}


def test_fan_out_and_fan_in__the_join_runs_once_after_every_parent():
    wf = Workflow()
    wf.add("extract", queue="t.wf", payload={"file": 42})
    for n in range(10):
        wf.add(f"part{n}", queue="t.wf", after=["extract"])
    wf.add("join", queue="t.wf", after=[f"part{n}" for n in range(10)])
    workflow_id = store.enqueue_workflow(wf)
    drain()
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "succeeded"
    join = workflow.steps["join"]
    assert sorted(join.result["seen"]) == [f"part{n}" for n in range(10)]
    assert runs_per_job() == {step.job_id: 1 for step in workflow.steps.values()}
    last_part = max(
        Run.objects.get(job_id=workflow.steps[f"part{n}"].job_id).created_at for n in range(10)
    )
    assert Run.objects.get(job_id=join.job_id).created_at >= last_part


def test_a_diamond__the_bottom_reads_both_sides():
    wf = Workflow()
    wf.add("extract", queue="t.wf", payload={"file": 42})
    wf.add("small", queue="t.wf", payload={"px": 64}, after=["extract"])
    wf.add("large", queue="t.wf", payload={"px": 512}, after=["extract"])
    wf.add("notify", queue="t.wf", payload={"user": 5}, after=["small", "large"])
    workflow_id = store.enqueue_workflow(wf)
    drain()
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "succeeded"
    assert sorted(workflow.steps["notify"].result["seen"]) == ["large", "small"]
    assert workflow.steps["notify"].after == ("small", "large")


def test_a_plain_job__has_no_workflow_and_no_step():
    job_id = store.queue("t.record").enqueue({})
    job = store.get_job(job_id)
    assert (job.workflow_id, job.step, job.keep_result_s) == (None, None, None)


def test_steps_of_several_queues__each_job_is_an_ordinary_job_of_its_queue():
    wf = Workflow()
    wf.add("first", queue="t.record", priority=5, max_attempts=7)
    wf.add("second", queue="t.wf", after=["first"], timeout_s=30)
    workflow_id = store.enqueue_workflow(wf)
    first = store.get_workflow(workflow_id).steps["first"]
    job = store.get_job(first.job_id)
    assert (job.queue, job.priority, job.max_attempts) == ("t.record", 5, 7)
    assert (job.workflow_id, job.step) == (workflow_id, "first")
    Worker(["t.record"], burst=True).run(threading.Event())
    second = store.get_workflow(workflow_id).steps["second"]
    assert second.state == "pending"
    assert store.get_job(second.job_id).timeout_s == 30
    assert store.get_workflow(workflow_id).steps["first"].result == {"ok": first.job_id}
    drain()
    assert store.get_workflow(workflow_id).state == "succeeded"
    assert WorkflowRow.objects.get(id=workflow_id).steps_open == 0
    assert WorkflowStep.objects.filter(workflow_id=workflow_id, state="succeeded").count() == 2
