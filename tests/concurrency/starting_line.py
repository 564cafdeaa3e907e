"""Start racers together: child processes released by a go file, or threads.

The parent (``race``) starts every child, waits until all have written their
``<go>.ready-<name>`` file (Django is set up, the connection can be opened),
then creates the go file; each child (``wait_for_go``) returns as soon as it
sees it. The race the test wants then starts in every process together.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from django.db import connections

READY_TIMEOUT_S = 30


def wait_for_go(go_file: str, name: str) -> None:
    """In a child: say ``name`` is ready, then wait for ``go_file`` to exist."""
    open(f"{go_file}.ready-{name}", "w").close()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("never told to go")
        time.sleep(0.005)


def race(commands: list[list[str]], go_file: Path, *, cwd: Path, env: dict[str, str]):
    """Start ``commands`` (each given the go file by the caller), release them together.

    Returns each child's (returncode, stdout, stderr), in order.
    """
    children = [
        subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    deadline = time.monotonic() + READY_TIMEOUT_S
    ready = f"{go_file.name}.ready-*"
    while len(list(go_file.parent.glob(ready))) < len(children) and time.monotonic() < deadline:
        time.sleep(0.02)
    go_file.touch()
    results = []
    for child in children:
        out, err = child.communicate(timeout=90)
        results.append((child.returncode, out, err))
    return results


def run_threads(count, target):
    """Run ``target(index)`` in ``count`` threads, each on its own connection; re-raise."""
    errors: list[BaseException] = []
    results: list = [None] * count

    def body(index):
        try:
            results[index] = target(index)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results
