"""A fresh SDK tracer provider per test, its spans kept in memory; the globals reset after.

OpenTelemetry lets the global provider be set once per process; these
fixtures reset it around each test (as ``opentelemetry-test-utils`` does),
so no other test in the session runs with tracing on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from alkstore_django import tracing


def reset_tracing() -> None:
    """Forget the global tracer provider and alkstore's kept tracer."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    tracing._tracer = None


@pytest.fixture
def no_provider() -> Iterator[None]:
    """The API importable, no provider set: the proxy a site without an SDK has."""
    reset_tracing()
    yield
    reset_tracing()


@pytest.fixture
def spans(no_provider) -> Iterator[InMemorySpanExporter]:
    """Set an SDK provider for the test; yield the exporter holding its finished spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
