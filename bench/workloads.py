"""alkstore workloads for one engine; ``bench/run.py`` calls this once per measurement.

Usage (the settings select the engine through ``BENCH_DATABASE_URL``)::

    python -m bench.workloads migrate
    python -m bench.workloads enqueue N BATCH        # BATCH 0 = one by one, autocommit
    python -m bench.workloads drain N PROCS [runworker args...]
    python -m bench.workloads drain-analyzed N PROCS [runworker args...]  # backlog ANALYZEd
    python -m bench.workloads drain-queue QUEUE N PROCS   # bench.noop, .limited or .rated
    python -m bench.workloads drain-io N [runworker args...]   # one worker, 50 ms async jobs
    python -m bench.workloads drain-kept N PROCS     # every job enqueued with keep_result_s=3600
    python -m bench.workloads workflow WIDTH PROCS FIRST  # 1 → WIDTH → 1, next to WIDTH + 2 jobs
    python -m bench.workloads drain-keyed N PROCS [PER_KEY] [KEYS]   # bench/steering.py
    python -m bench.workloads drain-progress N PROCS          # progress() once per job
    python -m bench.workloads progress-write N                # a progress write's own cost
    python -m bench.workloads progress-calls CALLS [runworker args...]
    python -m bench.workloads latency N
    python -m bench.workloads backlog-fill PENDING DEAD
    python -m bench.workloads backlog-run JOBS

Each prints one JSON object on its last line of stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

# Not resolved: bench/run.py --baseline runs this code from a directory whose
# ``bench`` is a symlink to this one and whose ``alkstore_django`` is another
# tree's, and the workers must start there too.
ROOT = Path(__file__).absolute().parent.parent


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()


def clear() -> None:
    """Empty the job tables (the bench database is the bench's own)."""
    from django.db import connection

    from alkstore_django import models
    from alkstore_django.models import DeadJob, Job

    # The kept results' and the workflows' tables, where this tree has them
    # (an earlier checkout run by --baseline may not): steps before workflows.
    extra = [
        getattr(models, name)._meta.db_table
        for name in ("JobResult", "WorkflowStep", "Workflow")
        if hasattr(models, name)
    ]
    with connection.cursor() as cursor:
        for model in (Job, DeadJob):
            table = model._meta.db_table
            if connection.vendor in ("postgresql", "mysql"):
                cursor.execute(f"TRUNCATE {table}")
            else:
                cursor.execute(f"DELETE FROM {table}")
        if extra and connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(extra)}")
        else:
            # MariaDB refuses to truncate a table that a foreign key names.
            for table in extra:
                cursor.execute(f"DELETE FROM {table}")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in [Job._meta.db_table, *extra]:
                cursor.execute(f"VACUUM ANALYZE {table}")


def counts() -> tuple[int, int]:
    from alkstore_django.models import DeadJob, Job

    return Job.objects.count(), DeadJob.objects.count()


def cmd_migrate() -> dict:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    clear()
    return {"ok": True}


def cmd_enqueue(n: int, batch: int) -> dict:
    from django.db import connections

    from alkstore_django import store

    clear()
    q = store.queue("bench.enqueue")
    q.enqueue({"warm": True})
    started = time.perf_counter()
    if batch <= 0:
        for i in range(n):
            q.enqueue({"i": i})
    else:
        for start in range(0, n, batch):
            q.enqueue_many([{"i": i} for i in range(start, min(start + batch, n))])
    elapsed = time.perf_counter() - started
    live, _ = counts()
    connections.close_all()
    assert live == n + 1, (live, n)
    return {"jobs": n, "seconds": elapsed, "rate": n / elapsed}


def enqueue_noops(q, n: int, **options) -> None:
    """Enqueue ``n`` no-op jobs (payload None) on the queue handle ``q``, a thousand at a time."""
    for start in range(0, n, 1000):
        q.enqueue_many([None] * min(1000, n - start), **options)


def worker_command(queue: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "django", "runworker", "--queue", queue, *extra]


def worker_env(mark_file: str) -> dict[str, str]:
    env = dict(os.environ)
    env["BENCH_MARK_FILE"] = mark_file
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def log_stamp(line: str) -> float:
    """Return a worker log line's time (``asctime``, local, to the millisecond) as monotonic."""
    wall = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return wall - (time.time() - time.monotonic())


class RssSampler:
    """Peak resident sets (``VmHWM``) of the workers and of their children, polled from /proc.

    ``wait4`` gives one figure per worker that also covers its reaped
    children; the process pool needs the parent's and the pool children's
    apart. The sentinel (a fork of the worker, mostly pages it shares) is
    kept apart from the pool children.
    """

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.parent_kb: dict[int, int] = {}
        self.children_kb: dict[int, int] = {}
        self.sentinel_kb: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _hwm_kb(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    @staticmethod
    def _children(pid: int) -> list[int]:
        found = []
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                found += [int(c) for c in task.read_text().split()]
        return found

    def _sample(self) -> None:
        for pid in self.pids:
            self.parent_kb[pid] = max(self.parent_kb.get(pid, 0), self._hwm_kb(pid))
            for child in self._children(pid):
                try:
                    cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                    # The child's module before and after the worker became a package.
                    pool_child = b"alkstore_django.worker.child" in cmdline or (
                        b"alkstore_django.child" in cmdline
                    )
                except OSError:
                    continue
                peaks = self.children_kb if pool_child else self.sentinel_kb
                peaks[child] = max(peaks.get(child, 0), self._hwm_kb(child))

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def cmd_drain(
    n: int,
    procs: int,
    extra: list[str],
    queue: str = "bench.noop",
    keep_result_s: float | None = None,
    fill=None,
    analyze: bool = False,
) -> dict:
    """Drain ``n`` no-op jobs of ``queue`` with ``procs`` ``runworker --burst`` processes.

    The rate is counted from the first handler start in any process (Django's
    start-up excluded) to the exit of the last process; ``wall_rate`` counts
    from the spawn, ``ack_rate`` only to the last ack's log line (the drain's
    work, without the process's exit). RSS is each process's peak (``wait4``,
    which covers its reaped children too), so at least its resident size after
    the drain; ``parent_rss_mb``, ``child_rss_mb`` and ``sentinel_rss_mb`` are
    the workers', their pool children's and their sentinels' peaks apart. CPU
    is the workers' and their children's, start-up included
    (``cpu_us_per_job``) or from each worker's first job on
    (``drain_cpu_us_per_job``: what the marking process had spent then,
    its mark says, taken off; that is the worker in the thread and asyncio
    pools, and its sentinel's CPU stays in whole). With
    ``keep_result_s`` every job is enqueued with it, and each must have left
    its result. ``fill(queue, n)``, when given, enqueues the jobs instead
    (``bench/steering.py``: with concurrency keys). With ``analyze`` the job
    table is analyzed once filled, so the planner's statistics show the
    backlog, as autovacuum's ANALYZE leaves them in production (``clear``
    analyzes it empty).
    """
    from django.db import connections

    from alkstore_django import store

    clear()
    q = store.queue(queue)
    kept = {} if keep_result_s is None else {"keep_result_s": keep_result_s}
    if fill is not None:
        fill(q, n)
    else:
        enqueue_noops(q, n, **kept)
    if analyze:
        analyze_jobs()
    connections.close_all()
    tmp = Path(tempfile.mkdtemp(prefix="alkbench-"))
    children = []
    spawned = time.monotonic()
    for index in range(procs):
        mark = str(tmp / f"mark-{index}")
        log = open(tmp / f"log-{index}", "w")  # noqa: SIM115
        children.append(
            subprocess.Popen(
                worker_command(queue, ["--burst", *extra]),
                env=worker_env(mark),
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
            )
        )
    sampler = RssSampler([child.pid for child in children])
    rss_kb = []
    codes = []
    cpu_s = 0.0
    for child in children:
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        codes.append(child.returncode)
        rss_kb.append(usage.ru_maxrss)
        cpu_s += usage.ru_utime + usage.ru_stime
    ended = time.monotonic()
    sampler.stop()
    firsts = []
    startup_cpu_s = 0.0
    for index in range(procs):
        path = tmp / f"mark-{index}"
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith("first "):
                    fields = line.split()
                    firsts.append(float(fields[1]))
                    startup_cpu_s += float(fields[2]) if len(fields) > 2 else 0.0
    live, dead = counts()
    results = kept_results() if keep_result_s is not None else 0
    connections.close_all()
    if keep_result_s is not None and results != n:
        raise SystemExit(f"drain kept {results} results of {n} jobs; logs in {tmp}")
    acked = 0
    last_ack = 0.0
    for index in range(procs):
        for line in (tmp / f"log-{index}").read_text().splitlines():
            if "outcome=acked" in line:
                acked += 1
                last_ack = max(last_ack, log_stamp(line))
    if codes != [0] * procs or live or dead or not firsts:
        raise SystemExit(
            f"drain failed: exit codes {codes}, {live} live, {dead} dead; logs in {tmp}"
        )
    first = min(firsts)
    for path in tmp.iterdir():
        path.unlink()
    tmp.rmdir()
    return {
        "jobs": n,
        "procs": procs,
        "seconds": ended - first,
        "rate": n / (ended - first),
        "wall_rate": n / (ended - spawned),
        "ack_rate": n / (last_ack - first),
        "logged_acks": acked,
        "rss_mb": max(rss_kb) / 1024,
        "parent_rss_mb": max(sampler.parent_kb.values(), default=0) / 1024,
        "child_rss_mb": max(sampler.children_kb.values(), default=0) / 1024,
        "children": len(sampler.children_kb),
        "sentinel_rss_mb": max(sampler.sentinel_kb.values(), default=0) / 1024,
        # Worker CPU (start-up included) per job, in microseconds.
        "cpu_us_per_job": cpu_s / n * 1e6,
        # The same from each worker's first job on (its CPU then is in its mark).
        "drain_cpu_us_per_job": (cpu_s - startup_cpu_s) / n * 1e6,
        "kept_results": results,
    }


def analyze_jobs() -> None:
    """Refresh the job table's planner statistics (``ANALYZE TABLE`` on MariaDB/MySQL)."""
    from django.db import connection

    from alkstore_django.models import Job

    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
        else:
            cursor.execute(f"ANALYZE {table}")


def kept_results() -> int:
    from alkstore_django.models import JobResult

    return JobResult.objects.filter(state="succeeded").count()


def cmd_latency(n: int, extra: list[str]) -> dict:
    """Enqueue ``n`` jobs one at a time to an idle worker; stamp commit and handler start."""
    from django.db import connections

    from alkstore_django import store

    clear()
    tmp = Path(tempfile.mkdtemp(prefix="alkbench-"))
    mark = tmp / "marks"
    mark.touch()
    log = open(tmp / "log", "w")  # noqa: SIM115
    child = subprocess.Popen(
        worker_command("bench.latency", extra),
        env=worker_env(str(mark)),
        stdout=subprocess.DEVNULL,
        stderr=log,
        cwd=ROOT,
    )
    q = store.queue("bench.latency")

    def wait_lines(count: int, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            lines = mark.read_text().splitlines()
            if len(lines) >= count or time.monotonic() > deadline:
                return lines
            time.sleep(0.01)

    try:
        # Warm up: the worker is up, listening, and has run a handler.
        for i in range(5):
            q.enqueue({"i": -1 - i})
            wait_lines(i + 1, 60)
        if len(mark.read_text().splitlines()) < 5:
            raise SystemExit(f"latency worker never started; log in {tmp}")
        rng = random.Random(7)
        committed: dict[int, float] = {}
        for i in range(n):
            # Jitter so the arrivals do not beat against any poll period.
            time.sleep(0.012 + rng.random() * 0.008)
            q.enqueue({"i": i})
            committed[i] = time.monotonic()
        lines = wait_lines(n + 5, 30)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(60)
        connections.close_all()
    started = {}
    for line in lines:
        key, stamp = line.split()
        started[int(key)] = float(stamp)
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
        "max_ms": ms[-1],
    }


def ack_stamps(logs: list[Path]) -> dict[int, float]:
    """Each acked job's id and the moment of its ack's log line (monotonic), from worker logs."""
    stamps: dict[int, float] = {}
    for path in logs:
        for line in path.read_text().splitlines():
            if "outcome=acked" in line and " job id=" in line:
                job_id = int(line.split(" job id=", 1)[1].split()[0])
                stamps[job_id] = log_stamp(line)
    return stamps


def process_cpu_s(pid: int) -> float:
    """A live process's CPU time so far (all its threads, user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until(done, what: str, timeout_s: float = 300, every_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(every_s)


def cmd_workflow(width: int, procs: int, first: str) -> dict:
    """A 1 → ``width`` → 1 workflow next to ``width + 2`` plain jobs, run by the same workers.

    ``procs`` idle ``runworker --queue bench.wf`` processes (not burst: a
    burst worker would leave while the root step runs) are started and warmed
    up (each has acked a job, a small workflow has run); then, in the order
    ``first`` says (``workflow`` or ``plain``), the tables are emptied and

    - the workflow (one root, ``width`` steps after it, one fan-in after all
      of them) is enqueued: ``workflow_enqueue_ms`` is ``enqueue_workflow``'s
      call, commit included; ``workflow_ms`` runs from its return to the
      fan-in's ack (its log line); the fan-in's runs are counted from its
      handler's stamps, and the workflow must read succeeded;
    - ``width + 2`` plain jobs go in with one ``enqueue_many``:
      ``plain_enqueue_ms``, then ``plain_ms`` to the last one's ack.

    ``fanin_wait_ms`` is the fan-in's handler start after its last parent's
    ack line: the release, the wake-up and the claim; ``root_ack_ms`` the
    root's handler start to its ack line, the ack that releases the
    ``width`` steps after it. ``*_cpu_us_per_step``
    is the workers' CPU (``/proc``, clock ticks) over each half, per step or job.
    """
    from django.db import connections

    from alkstore_django import Workflow, store
    from alkstore_django.models import DeadJob, Job
    from alkstore_django.models import Workflow as WorkflowRow

    steps = width + 2

    def build(n: int) -> Workflow:
        wf = Workflow(name=f"bench 1-{n}-1")
        wf.add("root", queue="bench.wf")
        middle = [f"step-{i}" for i in range(n)]
        for name in middle:
            wf.add(name, queue="bench.wf", after=["root"])
        wf.add("fan-in", queue="bench.wf", after=middle)
        return wf

    def idle() -> bool:
        running = WorkflowRow.objects.filter(state="running").exists()
        return not running and not Job.objects.exists()

    def run_workflow() -> dict:
        wf = build(width)
        started = time.monotonic()
        workflow_id = store.enqueue_workflow(wf)
        enqueued = time.monotonic()
        wait_until(
            lambda: not WorkflowRow.objects.filter(id=workflow_id, state="running").exists(),
            "the workflow to finish",
        )
        record = store.get_workflow(workflow_id)
        assert record is not None
        ids = {name: step.job_id for name, step in record.steps.items()}
        wait_until(
            lambda: set(ids.values()) <= ack_stamps(logs).keys(),
            "the workflow's ack lines",
            timeout_s=10,
        )
        stamps = ack_stamps(logs)
        lines = [line.split() for mark in marks for line in mark.read_text().splitlines()]
        runs = [float(t) for step, wf, t in lines if step == "fan-in" and wf == str(workflow_id)]
        root = [float(t) for step, wf, t in lines if step == "root" and wf == str(workflow_id)]
        last_parent = max(stamps[ids[f"step-{i}"]] for i in range(width))
        succeeded = [s.state == "succeeded" for s in record.steps.values()]
        if record.state != "succeeded" or len(runs) != 1 or not all(succeeded):
            raise SystemExit(
                f"workflow ended {record.state}, {sum(succeeded)} steps succeeded, the fan-in "
                f"ran {len(runs)} times; logs in {tmp}"
            )
        end = stamps[ids["fan-in"]]
        return {
            "workflow_state": record.state,
            "steps_succeeded": sum(succeeded),
            "fanin_runs": len(runs),
            "workflow_enqueue_ms": (enqueued - started) * 1000,
            "workflow_ms": (end - enqueued) * 1000,
            "workflow_rate": steps / (end - enqueued),
            "fanin_wait_ms": (runs[0] - last_parent) * 1000,
            "root_ack_ms": (stamps[ids["root"]] - root[0]) * 1000,
        }

    def run_plain() -> dict:
        started = time.monotonic()
        job_ids = q.enqueue_many([None] * steps)
        enqueued = time.monotonic()
        wait_until(lambda: not Job.objects.exists(), "the plain jobs to finish")
        wait_until(
            lambda: set(job_ids) <= ack_stamps(logs).keys(),
            "the plain jobs' ack lines",
            timeout_s=10,
        )
        stamps = ack_stamps(logs)
        last = max(stamps[i] for i in job_ids)
        return {
            "plain_enqueue_ms": (enqueued - started) * 1000,
            "plain_ms": (last - enqueued) * 1000,
            "plain_rate": steps / (last - enqueued),
        }

    clear()
    q = store.queue("bench.wf")
    tmp = Path(tempfile.mkdtemp(prefix="alkbench-"))
    marks = [tmp / f"mark-{index}" for index in range(procs)]
    logs = [tmp / f"log-{index}" for index in range(procs)]
    children = []
    for mark, log_path in zip(marks, logs, strict=True):
        mark.touch()
        log = open(log_path, "w")  # noqa: SIM115
        children.append(
            subprocess.Popen(
                worker_command("bench.wf", []),
                env=worker_env(str(mark)),
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
            )
        )
    result: dict = {"steps": steps, "procs": procs, "first": first}
    try:
        # Warm up: every worker has acked a job, and a small workflow has run through.
        deadline = time.monotonic() + 120
        store.enqueue_workflow(build(4))
        while not all("outcome=acked" in path.read_text() for path in logs):
            if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                raise SystemExit(f"workflow workers never started; logs in {tmp}")
            # More than one worker's batch (32), so that each gets some.
            q.enqueue_many([None] * (64 * procs))
            time.sleep(0.3)
        wait_until(idle, "the warm-up to finish")
        phases = {"workflow": run_workflow, "plain": run_plain}
        for phase in ["workflow", "plain"] if first == "workflow" else ["plain", "workflow"]:
            clear()
            before = sum(process_cpu_s(child.pid) for child in children)
            result.update(phases[phase]())
            cpu_s = sum(process_cpu_s(child.pid) for child in children) - before
            result[f"{phase}_cpu_us_per_step"] = cpu_s / steps * 1e6
        if DeadJob.objects.exists():
            raise SystemExit(f"workflow bench left dead letters; logs in {tmp}")
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait(60)
        connections.close_all()
    for path in tmp.iterdir():
        path.unlink()
    tmp.rmdir()
    return result


def fill_backlog(pending: int, dead: int) -> None:
    """Write ``pending`` due rows over ten other queues and ``dead`` dead letters.

    PostgreSQL reuses ``bench/claim_backlog.py``'s fill; SQLite builds the
    same rows with a recursive CTE.
    """
    from django.db import connection

    from alkstore_django.models import DeadJob, Job

    if connection.vendor == "postgresql":
        from bench.claim_backlog import fill

        fill(pending, dead)
        return
    if connection.vendor == "mysql":
        fill_backlog_mariadb(pending, dead)
        return
    job, dead_table = Job._meta.db_table, DeadJob._meta.db_table
    series = "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s) "
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {job}")
        cursor.execute(f"DELETE FROM {dead_table}")
        cursor.execute(
            f"INSERT INTO {job} (queue, payload, priority, run_at, attempts, max_attempts, "
            "visibility_timeout_s, retry_base_s, state, enqueued_at) "
            f"{series}SELECT 'other-' || (n %% 10), json_object('n', n), n %% 5, "
            "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('-%%d seconds', n %% 86400)), "
            "0, 3, 300, 5, 'pending', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') FROM g",
            [pending],
        )
        if dead:
            cursor.execute(
                f"INSERT INTO {dead_table} (id, queue, payload, priority, run_at, attempts, "
                "max_attempts, visibility_timeout_s, retry_base_s, worker_id, enqueued_at, "
                f"last_error, died_at) {series}SELECT -n, 'other-' || (n %% 10), '{{}}', 0, "
                "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), 3, 3, 300, 5, 'w', "
                "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), 'max attempts exceeded', "
                "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('-%%d seconds', n %% 86400)) "
                "FROM g",
                [dead],
            )
        cursor.execute("ANALYZE")


def fill_backlog_mariadb(pending: int, dead: int) -> None:
    """``fill_backlog`` on MariaDB: the same rows from its sequence engine."""
    from django.db import connection

    from alkstore_django.models import DeadJob, Job

    job, dead_table = Job._meta.db_table, DeadJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {job}")
        cursor.execute(f"TRUNCATE {dead_table}")
        cursor.execute(
            f"INSERT INTO {job} (queue, payload, priority, run_at, attempts, max_attempts, "
            "visibility_timeout_s, retry_base_s, state, enqueued_at) "
            "SELECT CONCAT('other-', MOD(seq, 10)), JSON_OBJECT('n', seq), MOD(seq, 5), "
            "UTC_TIMESTAMP(6) - INTERVAL MOD(seq, 86400) SECOND, 0, 3, 300, 5, 'pending', "
            f"UTC_TIMESTAMP(6) FROM seq_1_to_{int(pending)}"
        )
        if dead:
            cursor.execute(
                f"INSERT INTO {dead_table} (id, queue, payload, priority, run_at, attempts, "
                "max_attempts, visibility_timeout_s, retry_base_s, worker_id, enqueued_at, "
                "last_error, died_at) SELECT -seq, CONCAT('other-', MOD(seq, 10)), '{}', 0, "
                "UTC_TIMESTAMP(6), 3, 3, 300, 5, 'w', UTC_TIMESTAMP(6), 'max attempts exceeded', "
                f"UTC_TIMESTAMP(6) - INTERVAL MOD(seq, 86400) SECOND FROM seq_1_to_{int(dead)}"
            )
        cursor.execute(f"ANALYZE TABLE {job}, {dead_table}")
        cursor.fetchall()


def settle_backlog() -> None:
    """Let the bulk fill's aftermath finish before timing, the same for every size.

    Writing two million rows leaves the server checkpointing and autovacuum
    due; a backlog in production was written over time and has been vacuumed.
    On SQLite the WAL is checkpointed and truncated, so every size starts from
    the same WAL (its size changes the cost of each commit's sync).
    """
    from django.db import connection

    from alkstore_django.models import DeadJob, Job

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")
            cursor.execute(f"VACUUM ANALYZE {DeadJob._meta.db_table}")
            cursor.execute("CHECKPOINT")
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {Job._meta.db_table}, {DeadJob._meta.db_table}")
            cursor.fetchall()
        else:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def cmd_backlog_fill(pending: int, dead: int) -> dict:
    """Write the backlog (see ``fill_backlog``) and let the server settle."""
    started = time.perf_counter()
    fill_backlog(pending, dead)
    settle_backlog()
    return {"pending": pending, "dead": dead, "fill_s": time.perf_counter() - started}


def cmd_backlog_run(jobs: int) -> dict:
    """Time the worker's claim+ack cycle, one job per cycle, behind the backlog.

    Each cycle is the worker's own statement: ack the previous job (fenced)
    and claim the next one, so the figure is the cost of one claim+ack. A
    first pass of 100 jobs warms the caches and the prepared statement.
    """
    from django.db import connections

    from alkstore_django import store

    q = store.queue("bench.claim")
    dialect = store.dialect
    rate = 0.0
    for size in (100, jobs):
        for start in range(0, size, 1000):
            q.enqueue_many([{"n": i} for i in range(start, min(start + 1000, size))])
        fences: list[tuple[int, int]] = []
        done = 0
        started = time.perf_counter()
        while True:
            acked, claimed = dialect.claim_and_ack("bench.claim", "bench", 1, "bench", fences)
            done += len(acked)
            if not claimed:
                break
            fences = [(job.id, job.attempts) for job in claimed]
        elapsed = time.perf_counter() - started
        if done != size:
            raise SystemExit(f"backlog run acked {done} of {size} jobs")
        rate = size / elapsed
    connections.close_all()
    return {"jobs": jobs, "rate": rate}


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command in STEERING:
        from bench import steering

        result = steering.main(command, args)
    else:
        setup()
        result = run_command(command, args)
    import alkstore_django

    # Which tree's package ran (bench/run.py --baseline checks it).
    result["alkstore_django"] = str(Path(alkstore_django.__file__).parent)
    print(json.dumps(result))


# The commands of issue 24's rows, in bench/steering.py.
STEERING = ("drain-keyed", "drain-progress", "progress-write", "progress-calls")


def run_command(command: str, args: list[str]) -> dict:
    if command == "migrate":
        result = cmd_migrate()
    elif command == "enqueue":
        result = cmd_enqueue(int(args[0]), int(args[1]))
    elif command == "drain":
        result = cmd_drain(int(args[0]), int(args[1]), args[2:])
    elif command == "drain-analyzed":
        result = cmd_drain(int(args[0]), int(args[1]), args[2:], analyze=True)
    elif command == "drain-queue":
        result = cmd_drain(int(args[1]), int(args[2]), [], queue=args[0])
    elif command == "drain-io":
        result = cmd_drain(int(args[0]), 1, args[1:], queue="bench.io")
    elif command == "drain-kept":
        result = cmd_drain(int(args[0]), int(args[1]), [], keep_result_s=3600)
    elif command == "workflow":
        result = cmd_workflow(int(args[0]), int(args[1]), args[2])
    elif command == "latency":
        result = cmd_latency(int(args[0]), args[1:])
    elif command == "backlog-fill":
        result = cmd_backlog_fill(int(args[0]), int(args[1]))
    elif command == "backlog-run":
        result = cmd_backlog_run(int(args[0]))
    else:
        raise SystemExit(f"unknown workload {command!r}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
