"""Tracing from the enqueue to the run: a request span, its enqueue, the worker's runs.

Each test sets an SDK tracer provider with an in-memory exporter (the
``spans`` fixture) and reads the finished spans: the run is a child of the
enqueue, which is a child of the request, and carries the messaging
attributes, the attempt and its outcome.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from alkstore_django import executor, handler, store, tracing
from alkstore_django.models import Job
from alkstore_django.testing import run_ready_jobs
from alkstore_django.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def tracer():
    # Asked each time: a tracer got once would keep the provider of the test that got it.
    return trace.get_tracer("tests.tracing")


@handler("tr.nested")
def nested(job):
    """Open a span of the handler's own: it must be a child of the run's span."""
    with tracer().start_as_current_span("handler work"):
        return {"ok": job.id}


def named(exported, name):
    return [s for s in exported.get_finished_spans() if s.name == name]


def only(exported, name):
    found = named(exported, name)
    assert len(found) == 1, [s.name for s in exported.get_finished_spans()]
    return found[0]


def stored_parent(job_id) -> str:
    """Return the span id (hex) the job's stored traceparent names."""
    carrier = json.loads(Job.objects.get(id=job_id).trace_context)
    return carrier["traceparent"].split("-")[2]


def test_request_enqueue_run__the_run_is_a_child_of_the_enqueue_in_the_requests_trace(spans):
    with tracer().start_as_current_span("GET /orders", kind=SpanKind.SERVER) as request:
        job_id = store.queue("tr.nested").enqueue({"order": 7})
    enqueue = only(spans, "alkstore.enqueue tr.nested")
    assert stored_parent(job_id) == f"{enqueue.context.span_id:016x}"

    [ran] = run_ready_jobs(["tr.nested"])

    assert ran.outcome == "acked"
    run = only(spans, "alkstore.run tr.nested")
    work = only(spans, "handler work")
    trace_id = request.get_span_context().trace_id
    assert {enqueue.context.trace_id, run.context.trace_id, work.context.trace_id} == {trace_id}
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert run.parent.span_id == enqueue.context.span_id
    assert work.parent.span_id == run.context.span_id
    assert (enqueue.kind, run.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert dict(enqueue.attributes) == {
        "messaging.system": "alkstore",
        "messaging.destination.name": "tr.nested",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": str(job_id),
    }
    assert dict(run.attributes) == {
        "messaging.system": "alkstore",
        "messaging.destination.name": "tr.nested",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(job_id),
        "alkstore.attempt": 1,
        "alkstore.outcome": "ack",
    }
    assert run.status.status_code == StatusCode.UNSET
    assert not run.links  # no span was current around the run


def test_worker_thread_pool__its_runs_belong_to_the_requests_trace(spans):
    with tracer().start_as_current_span("POST /batch") as request:
        ids = store.queue("tr.nested").enqueue_many([{"n": n} for n in range(5)])
    enqueue = only(spans, "alkstore.enqueue tr.nested")
    assert enqueue.attributes["messaging.batch.message_count"] == 5
    assert "messaging.message.id" not in enqueue.attributes
    # Every job of the batch stores the context of its one enqueue span.
    assert {stored_parent(job_id) for job_id in ids} == {f"{enqueue.context.span_id:016x}"}

    stats = Worker(["tr.nested"], burst=True, concurrency=3, poll_interval_s=0.2).run(
        threading.Event()
    )

    assert stats.acked == 5
    runs = named(spans, "alkstore.run tr.nested")
    assert sorted(int(s.attributes["messaging.message.id"]) for s in runs) == ids
    for run in runs:
        assert run.context.trace_id == request.get_span_context().trace_id
        assert run.parent.span_id == enqueue.context.span_id
        assert run.attributes["alkstore.outcome"] == "ack"
    works = named(spans, "handler work")
    assert {s.parent.span_id for s in works} == {s.context.span_id for s in runs}


def test_failed_attempts__each_records_its_exception_on_its_run_span(spans):
    job_id = store.queue("t.raise", max_attempts=2, retry_base_s=0).enqueue("x")

    runs = run_ready_jobs(["t.raise"])

    assert [r.outcome for r in runs] == ["retried", "dead"]
    enqueue = only(spans, "alkstore.enqueue t.raise")
    attempts = sorted(named(spans, "alkstore.run t.raise"), key=lambda s: s.start_time)
    assert [s.attributes["alkstore.attempt"] for s in attempts] == [1, 2]
    for span in attempts:
        assert span.parent.span_id == enqueue.context.span_id
        assert span.attributes["alkstore.outcome"] == "retry"
        assert span.attributes["error.type"] == "builtins.ValueError"
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description == "ValueError: boom x"
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes["exception.message"] == "boom x"
        assert "ValueError" in event.attributes["exception.type"]
    assert store.get_job(job_id).state == "dead"


def test_fail_and_snooze__name_their_outcome_and_only_the_fail_is_an_error(spans):
    store.queue("t.fail").enqueue("x")
    store.queue("t.snooze").enqueue({"times": 1})

    run_ready_jobs(["t.fail", "t.snooze"])

    failed = only(spans, "alkstore.run t.fail")
    assert failed.attributes["alkstore.outcome"] == "fail"
    assert failed.attributes["error.type"] == "alkstore_django.errors.Fail"
    assert failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    snoozed = sorted(named(spans, "alkstore.run t.snooze"), key=lambda s: s.start_time)
    assert [s.attributes["alkstore.outcome"] for s in snoozed] == ["snooze", "ack"]
    assert {s.status.status_code for s in snoozed} == {StatusCode.UNSET}
    assert not any(s.events for s in snoozed)


def test_run_inside_another_span__keeps_its_enqueue_as_parent_and_links_the_ambient_span(spans):
    with tracer().start_as_current_span("request"):
        store.queue("t.record").enqueue({})
    enqueue = only(spans, "alkstore.enqueue t.record")

    with tracer().start_as_current_span("test helper") as ambient:
        run_ready_jobs(["t.record"])

    run = only(spans, "alkstore.run t.record")
    assert run.parent.span_id == enqueue.context.span_id
    assert [link.context.span_id for link in run.links] == [ambient.get_span_context().span_id]


def test_no_provider__stores_no_context_and_a_provider_set_later_traces_the_run(no_provider):
    assert tracing.tracer() is None  # the API's proxy provider: not tracing
    job_id = store.queue("t.record").enqueue({})
    assert Job.objects.get(id=job_id).trace_context is None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    run_ready_jobs(["t.record"])

    run = only(exporter, "alkstore.run t.record")
    assert run.parent is None  # enqueued untraced: the run is a root
    assert run.attributes["alkstore.outcome"] == "ack"
    provider.shutdown()


def test_a_stored_context_that_cannot_be_read__runs_as_a_root_span(spans):
    job_id = store.queue("t.record").enqueue({})
    Job.objects.filter(id=job_id).update(trace_context="not json {")

    [ran] = run_ready_jobs(["t.record"])

    assert ran.outcome == "acked"
    run = only(spans, "alkstore.run t.record")
    assert run.parent is None


def test_unique_enqueue__a_duplicate_names_the_holder_and_a_refusal_is_an_error(spans):
    q = store.queue("t.record")
    first = q.enqueue({}, unique_key="k")
    assert q.enqueue({}, unique_key="k") == first
    with pytest.raises(Exception, match="held by job"):
        q.enqueue({}, unique_key="k", on_duplicate="raise")

    enqueues = sorted(named(spans, "alkstore.enqueue t.record"), key=lambda s: s.start_time)
    assert [s.attributes.get("messaging.message.id") for s in enqueues] == [str(first)] * 2 + [None]
    assert enqueues[2].status.status_code == StatusCode.ERROR
    assert enqueues[2].attributes["error.type"] == "alkstore_django.errors.DuplicateJob"
    # The one job stores the context of the enqueue that wrote it.
    assert stored_parent(first) == f"{enqueues[0].context.span_id:016x}"


async def _async_nested(job):
    with tracer().start_as_current_span("async handler work"):
        await asyncio.sleep(0)
        return job.id


def test_arun_handler__the_async_run_has_the_same_span_as_the_sync_one(spans):
    with tracer().start_as_current_span("request"):
        store.queue("tr.async").enqueue({})
    handle = store.queue("tr.async").claim_one("w1")

    outcome = asyncio.run(executor.arun_handler(_async_nested, handle.job, handle.job))

    assert outcome.kind == "ack"
    enqueue = only(spans, "alkstore.enqueue tr.async")
    run = only(spans, "alkstore.run tr.async")
    work = only(spans, "async handler work")
    assert run.parent.span_id == enqueue.context.span_id
    assert work.parent.span_id == run.context.span_id
    assert run.attributes["alkstore.outcome"] == "ack"


def test_arun_handler__a_cancelled_run_records_the_cancellation_and_ends_its_span(spans):
    store.queue("tr.async").enqueue({})
    handle = store.queue("tr.async").claim_one("w1")

    async def forever(job):
        await asyncio.sleep(60)

    async def cancel_it():
        task = asyncio.ensure_future(executor.arun_handler(forever, handle.job, handle.job))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())

    run = only(spans, "alkstore.run tr.async")
    assert "alkstore.outcome" not in run.attributes
    assert run.status.status_code == StatusCode.ERROR
    assert run.attributes["error.type"] == "asyncio.exceptions.CancelledError"
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached
