"""Prometheus metrics: the site's view over the tables, and a worker's own port."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from alkstore_django import overview, presence, store
from alkstore_django.testing import run_ready_jobs
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db


def samples(text):
    """Return {(name, sorted labels): value} from a scrape, parsed by prometheus_client."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_view__serves_queue_worker_and_schedule_figures_matching_the_overview(admin_client):
    store.queue("m.q").enqueue_many([1, 2, 3])
    store.queue("m.q").enqueue(4, delay_s=600)
    store.queue("t.raise", max_attempts=1).enqueue("x")
    run_ready_jobs(["t.raise"])
    presence.announce(
        "default", "w-1", queues=["m.q"], pool="threads", concurrency=2, counts=(7, 2, 1)
    )
    response = admin_client.get("/alkstore/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    got = samples(response.content.decode())
    counts = {s.queue: s for s in overview.queue_overview()}
    for state in ("pending", "scheduled", "processing", "overdue", "dead"):
        for queue in ("m.q", "t.raise"):
            key = ("alkstore_queue_jobs", (("queue", queue), ("state", state)))
            assert got[key] == getattr(counts[queue], state)
    assert got[("alkstore_queue_jobs", (("queue", "m.q"), ("state", "pending")))] == 3
    assert got[("alkstore_queue_jobs", (("queue", "t.raise"), ("state", "dead")))] == 1
    assert got[("alkstore_queue_consumers", (("queue", "m.q"),))] == 1
    worker = (("outcome", "acked"), ("worker_id", "w-1"))
    assert got[("alkstore_worker_jobs_total", worker)] == 7


def test_view__refuses_anonymous_requests_and_accepts_the_bearer_token(client, settings):
    assert client.get("/alkstore/metrics").status_code == 403
    settings.ALKSTORE = {"METRICS_TOKEN": "s3cret"}
    assert client.get("/alkstore/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    response = client.get("/alkstore/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_worker_port__counts_match_the_jobs_it_ran(subprocess_env):
    store.queue("t.record").enqueue_many(list(range(12)))
    store.queue("t.raise", max_attempts=2).enqueue("x")
    port = free_port()
    cmd = [sys.executable, "-m", "django", "runworker", "--settings", "tests.settings"]
    proc = subprocess.Popen(
        [*cmd, "--queue", "t.record", "--queue", "t.raise", "--metrics-port", str(port)],
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def scrape():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return samples(r.read().decode())
        except OSError:
            return {}

    retried = ("alkstore_worker_jobs_total", (("outcome", "retried"), ("queue", "t.raise")))

    def settled():
        # The failing job may settle after the twelve acks (its traceback is
        # logged first): wait for both.
        got = scrape()
        acked = got.get(
            ("alkstore_worker_jobs_total", (("outcome", "acked"), ("queue", "t.record")))
        )
        return got if acked == 12 and retried in got else None

    try:
        got = wait_for(settled, timeout=30)
    finally:
        proc.terminate()
        proc.wait(30)
    assert got, "the worker's metrics never showed the 12 acks and the retry"
    assert got[retried] == 1
    count = ("alkstore_worker_job_duration_seconds_count", (("queue", "t.record"),))
    assert got[count] == 12
    assert got[("alkstore_worker_claim_duration_seconds_count", (("queue", "t.record"),))] >= 1


def _serves(host, port):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("args", "served", "refused"),
    [([], "127.0.0.1", "127.0.0.2"), (["--metrics-host", "127.0.0.2"], "127.0.0.2", "127.0.0.1")],
    ids=["default-loopback-only", "metrics-host"],
)
def test_worker_port__listens_on_metrics_host_only(subprocess_env, args, served, refused):
    # 127.0.0.2 is another loopback address: a server bound to every interface answers on it.
    port = free_port()
    cmd = [sys.executable, "-m", "django", "runworker", "--queue", "t.record"]
    proc = subprocess.Popen(
        [*cmd, "--metrics-port", str(port), *args],
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: _serves(served, port), timeout=30)
        assert not _serves(refused, port)  # before the fix: 0.0.0.0, so it answered
    finally:
        proc.terminate()
        proc.wait(30)
