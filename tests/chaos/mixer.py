"""One process that enqueues and drains a queue at the same time (chaos scenario 8).

Usage: ``python -m tests.chaos.mixer NAME COUNT FOLDER PEERS``

It writes ``FOLDER/ready-NAME``, waits for ``FOLDER/go`` (so every process
starts racing at once), then enqueues COUNT jobs in random small batches,
some inside ``transaction.atomic()``, draining a few jobs (claim, record the
run, ack) between batches. When done enqueueing it writes ``FOLDER/done-NAME``
and drains until all PEERS are done and the queue stays empty. Every
exception is caught and reported, none is retried: the test asserts there
were none. The last line of output is JSON: enqueued, acked, refused, errors.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

QUEUE = "chaos.mix"
DEADLINE_S = 600


def main() -> None:
    name, count, folder, peers = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    import django

    django.setup()
    from django.db import transaction

    from alkstore_django import store
    from tests.testapp.chaos_jobs import record

    rng = random.Random(name)
    queue = store.queue(QUEUE, visibility_timeout_s=60)
    enqueued: list[int] = []
    acked: list[int] = []
    refused: list[int] = []
    errors: list[str] = []

    def attempt(call):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on any
            errors.append(f"{type(exc).__name__}: {exc}")
            return None

    def enqueue_some(n: int) -> list[int]:
        if rng.random() < 0.3:
            with transaction.atomic():
                return queue.enqueue_many([{"by": name}] * n)
        if n == 1:
            return [queue.enqueue({"by": name})]
        return queue.enqueue_many([{"by": name}] * n)

    def drain_some(n: int) -> int:
        handles = attempt(lambda: queue.claim_batch(name, n)) or []
        for handle in handles:
            attempt(lambda h=handle: record(h.job))
            (acked if attempt(handle.ack) else refused).append(handle.job.id)
        return len(handles)

    (folder / f"ready-{name}").touch()
    deadline = time.monotonic() + DEADLINE_S
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    while len(enqueued) < count and time.monotonic() < deadline:
        n = min(rng.randint(1, 10), count - len(enqueued))
        enqueued += attempt(lambda n=n: enqueue_some(n)) or []
        drain_some(rng.randint(1, 5))
    (folder / f"done-{name}").touch()
    idle = 0
    while idle < 3 and time.monotonic() < deadline:
        everyone_done = len(list(folder.glob("done-*"))) >= peers
        if drain_some(10) == 0 and everyone_done:
            idle += 1
            time.sleep(0.05)
        else:
            idle = 0
    result = {"enqueued": enqueued, "acked": acked, "refused": refused, "errors": errors}
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
