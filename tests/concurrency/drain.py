"""A worker process for the exactly-once tests: drain one queue, print what it acked.

Usage: python -m tests.concurrency.drain QUEUE WORKER_ID GO_FILE [WORK_S]
It waits for GO_FILE to exist (so every process starts racing at once), then
claims in small batches and acks each job (after WORK_S seconds of "work",
as a handler would take) until a claim comes back empty, and
prints one JSON line: {"acked": [...], "refused": [...]}.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    queue_name, worker_id, go_file = sys.argv[1:4]
    work_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    import django

    django.setup()
    from alkstore_django import store
    from tests.concurrency.starting_line import wait_for_go

    wait_for_go(go_file, worker_id)
    queue = store.queue(queue_name)
    acked: list[int] = []
    refused: list[int] = []
    while True:
        handles = queue.claim_batch(worker_id, 3)
        if not handles:
            break
        for handle in handles:
            time.sleep(work_s)
            (acked if handle.ack() else refused).append(handle.job.id)
    print(json.dumps({"acked": acked, "refused": refused}))


if __name__ == "__main__":
    main()
