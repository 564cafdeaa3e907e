"""OpenTelemetry traces from the enqueue to the run (the ``otel`` extra, on ``opentelemetry-api``).

With a tracer provider set (the site's SDK, or an auto-instrumentation
agent), an enqueue opens an ``alkstore.enqueue <queue>`` span (PRODUCER) and
stores its context on every job it writes (``Job.trace_context``: the
global propagator's carrier as JSON, W3C ``traceparent`` by default); each
attempt then runs inside a ``alkstore.run <queue>`` span (CONSUMER) whose
parent is that stored context, with the messaging attributes, the attempt
and its outcome. A workflow opens an ``alkstore.enqueue_workflow`` span
whose context the workflow row keeps: every step released later, by
whichever worker, is enqueued under it, so one workflow is one trace.

The parent, not only a link: the OpenTelemetry messaging conventions make a
link the default (a batch has many creation contexts; a consumer may run
inside another span) and allow the creation context as the parent
"exclusively for single messages scenarios". An attempt runs exactly one
job, and a worker runs it inside no span of its own, so the run is a child
of its enqueue: request, enqueue and runs read as one trace. A run started
inside another span (the test helpers, ``Outbox.run_once`` in a request)
keeps its enqueue as the parent and links that ambient span, as the
conventions ask.

Nothing here imports ``opentelemetry`` until the first enqueue or run asks
(the import is tried once); a site without the package then pays two global
reads per call. A site that has the API but set no provider (the API's
proxy, or its no-op provider) pays a read of the API's global provider per
call; once a real one is set, the tracer is kept (OpenTelemetry lets the
global provider be set only once). Figures: docs/operations.md, Tracing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

from .error_text import class_path

if TYPE_CHECKING:
    from .records import Job

__all__ = [
    "EnqueueSpan",
    "RunSpan",
    "end_run",
    "start_enqueue",
    "start_run",
    "start_workflow",
    "tracer",
]

SYSTEM = "alkstore"
# The status description of a failed run: the stored error, capped.
MAX_STATUS_CHARS = 1_000
# The outcomes (``OutcomeKind``) that mark a run's span as an error.
FAILED_KINDS = frozenset({"retry", "fail", "cancel"})

# None: not tried yet; False: opentelemetry cannot be imported; else the API's names.
_api: Any = None
# The tracer of the global provider, once a real one is set (it cannot change after).
_tracer: Any = None
_MISSING = object()


class _Api:
    """The few OpenTelemetry API names this module uses, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER

        # A provider named by the environment is loaded by the API's getter, on first use.
        self.env_provider = OTEL_PYTHON_TRACER_PROVIDER in os.environ
        self.context = context
        self.propagate = propagate
        self.trace = trace
        self.unset = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self.producer = trace.SpanKind.PRODUCER
        self.consumer = trace.SpanKind.CONSUMER
        self.internal = trace.SpanKind.INTERNAL
        self.error = trace.StatusCode.ERROR


def _load() -> Any:
    global _api
    try:
        _api = _Api()
    except ImportError:
        _api = False
    return _api


def tracer() -> Any:
    """Return alkstore's tracer when a tracer provider is set, else None.

    None when ``opentelemetry`` cannot be imported (asked once) and while the
    global provider is the API's default proxy or its no-op provider.
    """
    if _tracer is not None:
        return _tracer
    api = _api
    if api is False:
        return None
    if api is None:
        api = _load()
        if api is False:
            return None
    # The API's global itself: while none is set, get_tracer_provider() looks
    # the environment up on every call, a microsecond on every job's run.
    provider = getattr(api.trace, "_TRACER_PROVIDER", _MISSING)
    if provider is None and not api.env_provider:
        return None
    if provider is None or provider is _MISSING:
        provider = api.trace.get_tracer_provider()
    if isinstance(provider, api.unset):
        return None
    return _keep(provider)


def _keep(provider: Any) -> Any:
    global _tracer
    try:
        version: str | None = metadata.version("alkstore-django")
    except metadata.PackageNotFoundError:
        version = None
    _tracer = provider.get_tracer("alkstore_django", version)
    return _tracer


def _extract(carrier: str | None) -> Any:
    """Return the context a stored carrier names, or None (none stored, or unreadable)."""
    if carrier is None:
        return None
    try:
        fields = json.loads(carrier)
    except ValueError:
        return None
    if not isinstance(fields, dict):
        return None
    return _api.propagate.extract(fields)


class EnqueueSpan:
    """An open enqueue (or workflow) span; ``carrier`` is its context, to store on the jobs.

    ``with span:`` makes it current (a database instrumentation's spans of
    the insert nest under it), records an exception that escapes, and ends it.
    """

    __slots__ = ("_context", "_token", "carrier", "span")

    def __init__(self, span: Any) -> None:
        api = _api
        self.span = span
        self._context = api.trace.set_span_in_context(span)
        fields: dict[str, str] = {}
        api.propagate.inject(fields, context=self._context)
        self.carrier = json.dumps(fields, separators=(",", ":")) if fields else None
        self._token: Any = None

    def __enter__(self) -> EnqueueSpan:
        self._token = _api.context.attach(self._context)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        _api.context.detach(self._token)
        if exc is not None:
            _failed(self.span, exc, class_path(exc), str(exc))
        self.span.end()

    def sent(self, ids: Sequence[int]) -> None:
        """Name the job written (one job; a duplicate names its holder) on the span."""
        if len(ids) == 1:
            self.span.set_attribute("messaging.message.id", str(ids[0]))

    def set(self, name: str, value: Any) -> None:
        """Set one attribute on the span."""
        self.span.set_attribute(name, value)


def start_enqueue(queue: str, count: int, parent: str | None = None) -> EnqueueSpan | None:
    """Start the span of an enqueue of ``count`` jobs to ``queue``; None when not tracing.

    Its parent is ``parent`` (a stored carrier: a workflow's), else the
    current span. The caller stores ``carrier`` on the jobs and runs the
    write inside ``with span:``.
    """
    tracer_ = _tracer
    if tracer_ is None:
        if _api is False:
            return None
        tracer_ = tracer()
        if tracer_ is None:
            return None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    span = tracer_.start_span(
        f"alkstore.enqueue {queue}",
        context=_extract(parent),
        kind=_api.producer,
        attributes=attributes,
    )
    return EnqueueSpan(span)


def start_workflow(name: str, steps: int) -> EnqueueSpan | None:
    """Start the span of a workflow's enqueue; its carrier is kept on the workflow's row."""
    tracer_ = tracer()
    if tracer_ is None:
        return None
    span = tracer_.start_span(
        f"alkstore.enqueue_workflow {name}" if name else "alkstore.enqueue_workflow",
        kind=_api.internal,
        attributes={
            "messaging.system": SYSTEM,
            "alkstore.workflow.name": name,
            "alkstore.workflow.steps": steps,
        },
    )
    return EnqueueSpan(span)


class RunSpan:
    """An attempt's open span, current in the handler's context until ``end_run``."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any, token: Any) -> None:
        self.span = span
        self.token = token


def start_run(job: Job) -> RunSpan | None:
    """Start the span of an attempt of ``job`` and make it current; None when not tracing.

    Its parent is the context stored at the enqueue; a job stored without
    one (enqueued before tracing was on) runs under the current span, or as
    a root. A span already current when a stored context exists is linked.
    """
    tracer_ = _tracer
    if tracer_ is None:
        if _api is False:  # the package is absent: the one check a run pays
            return None
        tracer_ = tracer()
        if tracer_ is None:
            return None
    api = _api
    parent = _extract(job.trace_context)
    links = None
    if parent is not None:
        ambient = api.trace.get_current_span().get_span_context()
        if ambient.is_valid:
            links = [api.trace.Link(ambient)]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": job.queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(job.id),
        "alkstore.attempt": job.attempts,
    }
    if job.workflow_id is not None:
        attributes["alkstore.workflow.id"] = job.workflow_id
        attributes["alkstore.workflow.step"] = job.step or ""
    span = tracer_.start_span(
        f"alkstore.run {job.queue}",
        context=parent,
        kind=api.consumer,
        attributes=attributes,
        links=links,
    )
    return RunSpan(span, api.context.attach(api.trace.set_span_in_context(span)))


def end_run(run: RunSpan, outcome: Any, exc: BaseException | None = None) -> None:
    """End ``run``'s span with what the attempt decided (an ``executor.Outcome``).

    A retry, fail or cancel records its exception and marks the span as an
    error. ``exc`` without an outcome is what ended the run from outside
    (``KeyboardInterrupt``, the asyncio pool's cancellation): recorded, no
    outcome named.
    """
    span = run.span
    try:
        if outcome is not None:
            span.set_attribute("alkstore.outcome", outcome.kind.value)
            if outcome.kind.value in FAILED_KINDS:
                error = outcome.error or outcome.kind.value
                _failed(span, outcome.exc, outcome.exc_class, error)
        elif exc is not None:
            _failed(span, exc, class_path(exc), str(exc) or type(exc).__name__)
    finally:
        _api.context.detach(run.token)
        span.end()


def _failed(span: Any, exc: BaseException | None, exc_class: str | None, error: str) -> None:
    if exc is not None:
        span.record_exception(exc)
    span.set_attribute("error.type", exc_class or "_OTHER")
    span.set_status(_api.trace.Status(_api.error, error[:MAX_STATUS_CHARS]))
