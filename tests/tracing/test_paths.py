"""Every path that writes jobs is traced: workflows, Tasks, the outbox, schedules, requeues.

Each path's jobs store the context of an ``alkstore.enqueue <queue>`` span
(PRODUCER), and their runs are its children.
"""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from alkstore_django import Workflow, operations, store
from alkstore_django.models import Job
from alkstore_django.models import Workflow as WorkflowRow
from alkstore_django.scheduler import tick
from alkstore_django.testing import run_ready_jobs, run_ready_tasks
from tests.helpers import boundaries_ago, needs_django_tasks

pytestmark = pytest.mark.django_db(transaction=True)


def tracer():
    return trace.get_tracer("tests.tracing")


def named(exported, name):
    return [s for s in exported.get_finished_spans() if s.name == name]


def only(exported, name):
    found = named(exported, name)
    assert len(found) == 1, [s.name for s in exported.get_finished_spans()]
    return found[0]


def test_workflow__is_one_trace_and_each_step_is_enqueued_under_the_workflows_span(spans):
    wf = Workflow("chain")
    wf.add("a", queue="t.wf")
    wf.add("b", queue="t.wf", after=["a"])
    with tracer().start_as_current_span("request") as request:
        workflow_id = store.enqueue_workflow(wf)
    workflow_span = only(spans, "alkstore.enqueue_workflow chain")
    assert workflow_span.parent.span_id == request.get_span_context().span_id
    assert workflow_span.attributes["alkstore.workflow.id"] == workflow_id
    stored = json.loads(WorkflowRow.objects.get(id=workflow_id).trace_context)
    assert stored["traceparent"].split("-")[2] == f"{workflow_span.context.span_id:016x}"

    # Step b is released by a's outcome, in the worker, with no span current.
    assert [r.outcome for r in run_ready_jobs(["t.wf"])] == ["acked", "acked"]

    assert store.get_workflow(workflow_id).state == "succeeded"
    enqueues = sorted(named(spans, "alkstore.enqueue t.wf"), key=lambda s: s.start_time)
    runs = sorted(named(spans, "alkstore.run t.wf"), key=lambda s: s.start_time)
    assert [s.attributes["alkstore.workflow.step"] for s in runs] == ["a", "b"]
    trace_id = request.get_span_context().trace_id
    for enqueue, run in zip(enqueues, runs, strict=True):
        assert enqueue.parent.span_id == workflow_span.context.span_id
        assert enqueue.attributes["alkstore.workflow.id"] == workflow_id
        assert run.parent.span_id == enqueue.context.span_id
        assert run.attributes["alkstore.workflow.id"] == workflow_id
        assert {enqueue.context.trace_id, run.context.trace_id} == {trace_id}


@needs_django_tasks()
def test_tasks_backend__a_task_is_enqueued_and_run_in_the_requests_trace(spans):
    from tests.testapp import tasks

    with tracer().start_as_current_span("request") as request:
        result = tasks.add.enqueue(2, 3)

    assert run_ready_tasks() == 1

    assert tasks.add.get_result(result.id).return_value == 5
    enqueue = only(spans, "alkstore.enqueue default")
    run = only(spans, "alkstore.run default")
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert run.parent.span_id == enqueue.context.span_id
    assert run.attributes["messaging.message.id"] == result.id
    assert run.attributes["alkstore.outcome"] == "ack"


def test_outbox__a_delivery_is_a_run_of_the_message_its_enqueue_wrote(spans):
    outbox = store.outbox("webhooks")
    with tracer().start_as_current_span("request") as request:
        message_id = outbox.enqueue({"event": "paid"})

    def deliver(handle):
        raise ValueError("endpoint down")

    assert outbox.run_once("w1", deliver) is True

    queue = outbox.queue.name
    enqueue = only(spans, f"alkstore.enqueue {queue}")
    delivery = only(spans, f"alkstore.run {queue}")
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert delivery.parent.span_id == enqueue.context.span_id
    assert delivery.kind == SpanKind.CONSUMER
    assert delivery.attributes["messaging.message.id"] == str(message_id)
    assert delivery.attributes["alkstore.outcome"] == "retry"
    assert [e.name for e in delivery.events] == ["exception"]


def test_schedule_fire__is_a_root_enqueue_span_whose_jobs_runs_are_its_children(spans):
    store.schedule("beat", "@every 10s", "t.record", {"kind": "beat"})
    boundaries_ago("beat", 2)

    assert tick(store) == 2
    run_ready_jobs(["t.record"])

    enqueue = only(spans, "alkstore.enqueue t.record")
    assert enqueue.parent is None  # no span was current in the tick
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.attributes["messaging.batch.message_count"] == 2
    runs = named(spans, "alkstore.run t.record")
    assert len(runs) == 2
    assert {s.parent.span_id for s in runs} == {enqueue.context.span_id}


def test_requeued_dead_letter__keeps_its_context_and_runs_again_under_its_enqueue(spans):
    with tracer().start_as_current_span("request") as request:
        job_id = store.queue("t.fail").enqueue("x")
    run_ready_jobs(["t.fail"])
    stored = Job.objects.filter(id=job_id).exists()
    assert not stored  # dead-lettered

    assert operations.requeue_dead([job_id]) == 1
    assert Job.objects.get(id=job_id).trace_context is not None
    run_ready_jobs(["t.fail"])

    enqueue = only(spans, "alkstore.enqueue t.fail")
    runs = named(spans, "alkstore.run t.fail")
    assert len(runs) == 2
    assert {s.parent.span_id for s in runs} == {enqueue.context.span_id}
    assert {s.context.trace_id for s in runs} == {request.get_span_context().trace_id}
