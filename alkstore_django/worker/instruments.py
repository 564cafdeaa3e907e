"""A worker's own Prometheus metrics: outcomes, run times and claim latency.

Enabled by ``runworker --metrics-port`` (which needs the ``metrics`` extra,
``prometheus-client``); otherwise every call here is a no-op, so a worker
without metrics pays nothing. The queue, worker and scheduler figures that
any process can read from the database are served by ``metrics.py`` instead.
"""

from __future__ import annotations

from typing import Any

# Run times from a millisecond to an hour; claims from 100 µs to 10 s.
RUN_BUCKETS_S = (0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 30, 120, 600, 3600)
CLAIM_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 10)


class Instruments:
    """Counters and histograms for one worker process, in ``registry`` when enabled."""

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry
        self.enabled = registry is not None
        if not self.enabled:
            return
        from prometheus_client import Counter, Histogram

        self._outcomes = Counter(
            "alkstore_worker_jobs",
            "Jobs this worker settled, by queue and outcome "
            "(acked, retried, dead, cancelled, lost).",
            ["queue", "outcome"],
            registry=registry,
        )
        self._run_time = Histogram(
            "alkstore_worker_job_duration_seconds",
            "How long handlers ran, by queue.",
            ["queue"],
            buckets=RUN_BUCKETS_S,
            registry=registry,
        )
        self._claim_time = Histogram(
            "alkstore_worker_claim_duration_seconds",
            "How long one claim statement took (acks of finished jobs included), by queue.",
            ["queue"],
            buckets=CLAIM_BUCKETS_S,
            registry=registry,
        )

    def outcome(self, queue: str, result: str, duration_ms: float) -> None:
        """Count one settled job and its run time."""
        if self.enabled:
            self._outcomes.labels(queue, result).inc()
            self._run_time.labels(queue).observe(duration_ms / 1000)

    def claim(self, queue: str, seconds: float) -> None:
        """Record how long one claim took."""
        if self.enabled:
            self._claim_time.labels(queue).observe(seconds)
