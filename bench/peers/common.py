"""Workload plumbing shared by the peer drivers; imports neither Django nor alkstore.

A driver module calls ``main(commands)`` with its own ``setup``, ``capabilities``,
``enqueue``, ``drain`` and ``latency`` callables; each prints one JSON line.
Worker processes stamp ``BENCH_MARK_FILE``: ``first <monotonic>`` once per
process for a drain (and, if they know it, ``last <monotonic>``: their last
ack), ``<i> <monotonic>`` per job for latency.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

_marks: dict[str, object] = {}


def mark_first() -> None:
    """Record, once per process, when this process started on its first job."""
    if "first" in _marks:
        return
    _marks["first"] = time.monotonic()
    path = os.environ.get("BENCH_MARK_FILE")
    if path:
        with open(path, "a") as f:
            # The process's CPU so far (every thread's): its start-up's.
            f.write(f"first {_marks['first']!r} {time.process_time()!r}\n")


def mark_last() -> None:
    """Record that this process's last ack has returned (a drain's ``ack_rate``)."""
    path = os.environ.get("BENCH_MARK_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"last {time.monotonic()!r}\n")


def mark_job(i: int) -> None:
    """Record that job ``i`` started now."""
    started = time.monotonic()
    f = _marks.get("file")
    if f is None:
        path = os.environ.get("BENCH_MARK_FILE")
        f = open(path, "a", buffering=1) if path else False  # noqa: SIM115
        _marks["file"] = f
    if f:
        f.write(f"{i} {started!r}\n")  # type: ignore[union-attr]


def child_env(mark_file: str) -> dict[str, str]:
    env = dict(os.environ)
    env["BENCH_MARK_FILE"] = mark_file
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def drain(worker: list[str], n: int, procs: int, left: Callable[[], int]) -> dict:
    """Run ``procs`` copies of ``worker`` (which exit when the queue is empty); time them.

    CPU is the workers' (``wait4``), start-up included (``cpu_us_per_job``)
    or from each one's first job on (``drain_cpu_us_per_job``: its CPU then,
    from its mark, taken off); RSS their peak (``ru_maxrss``). Workers that
    mark their last ack also get ``ack_rate``: to the last one, exits left out.
    """
    tmp = Path(tempfile.mkdtemp(prefix="alkbench-peer-"))
    children = []
    spawned = time.monotonic()
    for index in range(procs):
        log = open(tmp / f"log-{index}", "w")  # noqa: SIM115
        children.append(
            subprocess.Popen(
                worker,
                env=child_env(str(tmp / f"mark-{index}")),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        )
    rss_kb, codes = [], []
    cpu_s = 0.0
    for child in children:
        _, status, usage = os.wait4(child.pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
        rss_kb.append(usage.ru_maxrss)
        cpu_s += usage.ru_utime + usage.ru_stime
    ended = time.monotonic()
    firsts, lasts = [], []
    startup_cpu_s = 0.0
    for index in range(procs):
        path = tmp / f"mark-{index}"
        if path.exists():
            for fields in (line.split() for line in path.read_text().splitlines()):
                if fields[0] == "last":
                    lasts.append(float(fields[1]))
                    continue
                firsts.append(float(fields[1]))
                startup_cpu_s += float(fields[2]) if len(fields) > 2 else 0.0
    remaining = left()
    if any(codes) or remaining or not firsts:
        raise SystemExit(f"peer drain failed: codes {codes}, {remaining} left; logs in {tmp}")
    for path in tmp.iterdir():
        path.unlink()
    tmp.rmdir()
    first = min(firsts)
    acked = {"ack_rate": n / (max(lasts) - first)} if lasts else {}
    return {
        "jobs": n,
        "procs": procs,
        "rate": n / (ended - first),
        **acked,
        "wall_rate": n / (ended - spawned),
        "rss_mb": max(rss_kb) / 1024,
        "cpu_us_per_job": cpu_s / n * 1e6,
        "drain_cpu_us_per_job": (cpu_s - startup_cpu_s) / n * 1e6,
    }


def latency(worker: list[str], enqueue_one: Callable[[int], None], n: int) -> dict:
    """Enqueue ``n`` jobs one at a time to an idle worker; stamp commit and handler start."""
    tmp = Path(tempfile.mkdtemp(prefix="alkbench-peer-"))
    mark = tmp / "marks"
    mark.touch()
    log = open(tmp / "log", "w")  # noqa: SIM115
    child = subprocess.Popen(
        worker, env=child_env(str(mark)), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
    )

    def wait_lines(count: int, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            lines = mark.read_text().splitlines()
            if len(lines) >= count or time.monotonic() > deadline:
                return lines
            time.sleep(0.01)

    try:
        for i in range(5):
            enqueue_one(-1 - i)
            wait_lines(i + 1, 60)
        rng = random.Random(7)
        committed = {}
        for i in range(n):
            time.sleep(0.012 + rng.random() * 0.008)
            enqueue_one(i)
            committed[i] = time.monotonic()
        lines = wait_lines(n + 5, 60)
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    started = {int(k): float(v) for k, v in (line.split() for line in lines)}
    missing = [i for i in range(n) if i not in started]
    if missing:
        raise SystemExit(f"{len(missing)} latency jobs never ran; log in {tmp}")
    ms = sorted((started[i] - committed[i]) * 1000 for i in range(n))
    for path in tmp.iterdir():
        path.unlink()
    tmp.rmdir()
    return {
        "jobs": n,
        "p50_ms": ms[len(ms) // 2],
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
    }


def timed_enqueue(n: int, batch: int, one: Callable[[int], None], many: Callable | None) -> dict:
    one(-1)
    started = time.perf_counter()
    if batch <= 0:
        for i in range(n):
            one(i)
    else:
        assert many is not None
        for start in range(0, n, batch):
            many(list(range(start, min(start + batch, n))))
    elapsed = time.perf_counter() - started
    return {"jobs": n, "rate": n / elapsed}


def main(commands: dict[str, Callable[..., dict]]) -> None:
    command, args = sys.argv[1], sys.argv[2:]
    print(json.dumps(commands[command](*args)))
