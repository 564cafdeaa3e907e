"""Tracing across processes: without the package nothing of it is imported; a pool child traces.

Real subprocesses on the test database: one where ``opentelemetry`` cannot
be imported (as on a site without the ``otel`` extra), one that only sets
Django up, and a ``runworker --pool processes`` whose children set their
own tracer provider (in settings) and write their spans to a file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from opentelemetry import trace

from alkstore_django import store
from tests.helpers import assert_acked_once, runworker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ABSENT = """
import json, sys
sys.modules["opentelemetry"] = None  # what "import opentelemetry" finds on a site without it
import django
django.setup()
from alkstore_django import store, tracing
from alkstore_django.models import Job
from alkstore_django.testing import run_ready_jobs
job_id = store.queue("t.record").enqueue({})
many = store.queue("t.record").enqueue_many([{}, {}])
stored = sorted(set(Job.objects.values_list("trace_context", flat=True)), key=str)
runs = run_ready_jobs(["t.record"])
loaded = sorted(m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v)
print(json.dumps({"runs": [r.outcome for r in runs], "stored": stored, "loaded": loaded,
                  "api": repr(tracing._api)}))
"""

SETUP_ONLY = """
import json, sys
import django
django.setup()
import alkstore_django, alkstore_django.executor, alkstore_django.queues, alkstore_django.tracing
from alkstore_django.worker import Worker
before = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
from alkstore_django import store
from alkstore_django.models import Job
job_id = store.queue("t.record").enqueue({})
print(json.dumps({"before": before, "stored": Job.objects.get(id=job_id).trace_context,
                  "after": "opentelemetry.trace" in sys.modules}))
"""

# Set where Django starts, so the worker and each of its children has a provider.
CHILD_PROVIDER = """
import json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def export(self, spans):
        with open(os.environ["TRACE_FILE"], "a") as out:
            for span in spans:
                out.write(json.dumps({
                    "name": span.name,
                    "pid": os.getpid(),
                    "trace_id": span.context.trace_id,
                    "parent": span.parent.span_id if span.parent else None,
                    "attributes": dict(span.attributes),
                }) + "\\n")
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
trace.set_tracer_provider(_provider)
"""


def run_python(env, code: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_the_package__nothing_of_it_is_imported_and_jobs_still_run(subprocess_env):
    seen = run_python(subprocess_env, ABSENT)

    assert seen["runs"] == ["acked"] * 3
    assert seen["stored"] == [None]
    assert seen["loaded"] == []
    assert seen["api"] == "False"  # tried once, on the first enqueue, and remembered


def test_django_setup_and_the_package_import_nothing_of_it_until_the_first_enqueue(
    subprocess_env,
):
    seen = run_python(subprocess_env, SETUP_ONLY)

    assert seen["before"] == []
    # Installed here but no provider set: the first enqueue imports the API and stores nothing.
    assert seen["after"] is True
    assert seen["stored"] is None


def test_process_pool__the_child_runs_the_job_in_the_requests_trace(
    spans, settings_variant, tmp_path
):
    env = settings_variant(CHILD_PROVIDER)
    env["TRACE_FILE"] = str(tmp_path / "spans.jsonl")
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        ids = store.queue("p.work").enqueue_many([{}] * 3)
    [enqueue] = [s for s in spans.get_finished_spans() if s.name == "alkstore.enqueue p.work"]

    proc = runworker(
        env, "--queue", "p.work", "--pool", "processes", "--concurrency", "1", "--burst",
        wait=False,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=90)

    assert proc.returncode == 0, out
    assert_acked_once(ids)
    lines = (tmp_path / "spans.jsonl").read_text().splitlines()
    runs = [r for r in map(json.loads, lines) if r["name"] == "alkstore.run p.work"]
    assert sorted(int(r["attributes"]["messaging.message.id"]) for r in runs) == ids
    assert {r["trace_id"] for r in runs} == {request.get_span_context().trace_id}
    assert {r["parent"] for r in runs} == {enqueue.context.span_id}
    # Run in the one child, which set its own provider: not in the worker's process.
    assert len({r["pid"] for r in runs}) == 1
    assert {r["pid"] for r in runs} != {proc.pid}
    assert {r["attributes"]["alkstore.outcome"] for r in runs} == {"ack"}
