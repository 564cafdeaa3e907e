"""An enqueuing process for the unique-key race: enqueue one key many times, print the ids.

Usage: python -m tests.concurrency.enqueue_key QUEUE KEY COUNT GO_FILE NAME
It waits for GO_FILE to exist (so both processes start racing at once), then
enqueues COUNT jobs with unique key KEY and prints the ids it got back as one
JSON list.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    queue_name, key, count, go_file, name = sys.argv[1:6]
    import django

    django.setup()
    from alkstore_django import store
    from tests.concurrency.starting_line import wait_for_go

    wait_for_go(go_file, name)
    queue = store.queue(queue_name)
    ids = [queue.enqueue({"by": name, "n": n}, unique_key=key) for n in range(int(count))]
    print(json.dumps(ids))


if __name__ == "__main__":
    main()
