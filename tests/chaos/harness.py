"""Real processes, the faults done to them, and the exact end-of-scenario accounting.

A scenario starts ``manage.py runworker`` / ``runscheduler`` processes (or a
small script) on the test database, hurts them, lets them finish, and then
``account()`` checks every enqueued job against three tables: the live jobs,
the dead letters, and ``ChaosRun`` (one row per handler run, keyed by job id
and attempt). A job run more than once must be explained by what happened to
the worker of every earlier run: it was killed, it logged the claim as lost
(it was paused, or the database went away, past its lease), or the handler
asked for a retry.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from alkstore_django.models import DeadJob, Job
from tests.helpers import wait_for
from tests.testapp.models import ChaosRun

LOST_RE = re.compile(r"(?:job id=(\d+) queue=\S+ outcome=lost|claim lost id=(\d+))")
RETRIED_RE = re.compile(r"job id=(\d+) queue=\S+ outcome=retried")
ACKED_RE = re.compile(r"job id=(\d+) queue=\S+ outcome=acked")


@dataclass
class Proc:
    """One child process and the file its output goes to."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    killed: bool = False
    stopped: bool = False
    terminated: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def handles_sigterm(self) -> bool:
        """True once the process has installed its SIGTERM handler (``SigCgt`` in /proc).

        Before that, SIGTERM kills it (exit -15): a scheduler standing by logs
        nothing to wait for.
        """
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return False
        caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt"))
        return bool(int(caught, 16) & 1 << (signal.SIGTERM - 1))

    def ready(self) -> bool:
        """True once the process has logged that its loop runs (signals are handled)."""
        log = self.log()
        return "worker started" in log or "scheduler " in log


# What a worker's sentinel logs when it SIGKILLs the worker as stalled (worker/sentinel.py).
WATCHDOG_KILL = "its sentinel kills it and settles its jobs"


class Fleet:
    """The scenario's processes: start, kill, stop, restart, and read their logs."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self.generations: dict[str, int] = defaultdict(int)
        self.kills = 0
        self.restarts = 0

    def start(self, name: str, argv: Sequence[str]) -> Proc:
        """Start ``python argv…`` with its output in ``<log_dir>/<name>.log``."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("w") as out:
            popen = subprocess.Popen(
                [sys.executable, *argv], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def start_worker(
        self,
        slot: str,
        queues: Sequence[str],
        *,
        concurrency: int = 4,
        batch: int | None = None,
        launcher: Sequence[str] = ("-m", "django"),
    ) -> Proc:
        """Start ``runworker`` for ``queues``; its worker id is ``<slot>.g<generation>``."""
        self.generations[slot] += 1
        worker_id = f"{slot}.g{self.generations[slot]}"
        argv = [*launcher, "runworker", "--settings", "tests.settings", "--worker-id", worker_id]
        argv += ["--concurrency", str(concurrency)]
        if batch is not None:
            argv += ["--batch", str(batch)]
        for queue in queues:
            argv += ["--queue", queue]
        return self.start(worker_id, argv)

    def start_scheduler(self, name: str, standby_interval_s: float = 0.5) -> Proc:
        argv = ["-m", "django", "runscheduler", "--settings", "tests.settings"]
        argv += ["--standby-interval", str(standby_interval_s)]
        return self.start(name, argv)

    def live(self) -> list[Proc]:
        return [p for p in self.procs if p.alive()]

    def by_pid(self, pid: int) -> Proc | None:
        return next((p for p in self.procs if p.pid == pid), None)

    def kill(self, proc: Proc) -> None:
        """SIGKILL ``proc``: no handler runs, no claim is released, nothing is flushed."""
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(10)
        proc.killed = True
        self.kills += 1

    def reap(self) -> list[Proc]:
        """Return the processes that died on their own since the last call, counted as kills."""
        dead = [p for p in self.procs if not p.alive() and not p.killed and not p.terminated]
        for proc in dead:
            proc.killed = True
            self.kills += 1
        return dead

    def pause(self, proc: Proc) -> None:
        proc.popen.send_signal(signal.SIGSTOP)
        proc.stopped = True

    def resume(self, proc: Proc) -> None:
        proc.popen.send_signal(signal.SIGCONT)
        proc.stopped = False

    def stop(self, proc: Proc, timeout: float = 30.0) -> int:
        """SIGTERM ``proc`` (resuming it first if paused) and return its exit code."""
        if proc.stopped:
            self.resume(proc)
        if proc.alive() and not proc.terminated:
            # A process still booting would die of it instead of stopping.
            wait_for(lambda: not proc.alive() or proc.handles_sigterm(), timeout)
            # Once only: a second SIGTERM tells runworker to leave at once.
            proc.popen.send_signal(signal.SIGTERM)
            proc.terminated = True
        try:
            return proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            return proc.popen.wait(10)

    def stop_all(self, timeout: float = 30.0) -> dict[str, int]:
        """Stop every live process gracefully; return the exit codes by name.

        A process still booting has no signal handler yet, so each is first
        given up to ``timeout`` seconds to come up.
        """
        wait_for(lambda: all(p.ready() for p in self.live()), timeout)
        for proc in self.live():
            if proc.stopped:
                self.resume(proc)
            proc.popen.send_signal(signal.SIGTERM)
            proc.terminated = True
        return {p.name: self.stop(p, timeout) for p in self.procs if not p.killed}

    def stop_all_cleanly(self, *, watchdog_kills: bool = False) -> None:
        """``stop_all``, then fail unless every process exited 0, with the logs' tails.

        With ``watchdog_kills``, a worker its own sentinel SIGKILLed as stalled
        (its log says so) counts as stopped: the scenario's accounting, not its
        exit code, then proves that nothing it held was lost or run twice.
        """
        codes = self.stop_all()
        stalled = self.watchdog_killed() if watchdog_kills else set()
        unclean = {
            name: code
            for name, code in codes.items()
            if code != 0 and not (code == -9 and name in stalled)
        }
        assert not unclean, (codes, self.tail())

    def cleanup(self) -> None:
        """Leave no child behind, whatever the test did."""
        for proc in self.procs:
            if proc.alive():
                if proc.stopped:
                    proc.popen.send_signal(signal.SIGCONT)
                proc.popen.kill()
                proc.popen.wait(10)

    def killed_names(self) -> set[str]:
        """The processes SIGKILLed: by the scenario, or as stalled by their own sentinel."""
        return {p.name for p in self.procs if p.killed} | self.watchdog_killed()

    def watchdog_killed(self) -> set[str]:
        """The workers their sentinel SIGKILLed as stalled (their log says so)."""
        return {p.name for p in self.procs if WATCHDOG_KILL in p.log()}

    def logs(self) -> str:
        return "".join(f"--- {p.name} ---\n{p.log()}" for p in self.procs)

    def tail(self, lines: int = 60) -> str:
        """The last lines of every log, for assertion messages."""
        return "".join(
            f"--- {p.name} (exit {p.popen.poll()}) ---\n"
            + "\n".join(p.log().splitlines()[-lines:])
            + "\n"
            for p in self.procs
        )

    def ids_logged(self, pattern: re.Pattern[str]) -> dict[str, set[int]]:
        """Map each process name to the job ids its log matched ``pattern`` for."""
        found: dict[str, set[int]] = {}
        for proc in self.procs:
            ids = set()
            for match in pattern.finditer(proc.log()):
                ids.add(int(next(g for g in match.groups() if g)))
            found[proc.name] = ids
        return found


@dataclass
class Figures:
    """What one scenario did and what it found, for the report and docs/reliability.md."""

    scenario: str
    engine: str
    enqueued: int = 0
    acked: int = 0
    dead: int = 0
    lost: int = 0
    double_run: int = 0
    rerun_after_kill: int = 0
    rerun_after_lost_claim: int = 0
    rerun_after_retry: int = 0
    unexplained: int = 0
    same_attempt_twice: int = 0
    kills: int = 0
    restarts: int = 0
    seconds: float = 0.0
    notes: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def account(scenario: str, engine: str, ids: Sequence[int], fleet: Fleet | None = None) -> Figures:
    """Check every id in ``ids`` against the live table, the dead letters and the runs.

    Acked: gone from both tables after at least one recorded run. Dead: a dead
    letter with a non-empty reason. Lost: anything else (still live, or gone
    without a run). Each earlier run of a job run more than once must be
    explained (kill, lost claim, retry); the rest are counted as unexplained.
    """
    wanted = set(ids)
    figures = Figures(scenario, engine, enqueued=len(wanted))
    runs: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for job_id, attempt, worker_id, duplicates in ChaosRun.objects.values_list(
        "job_id", "attempt", "worker_id", "duplicates"
    ):
        if job_id in wanted:
            runs[job_id].append((attempt, worker_id))
            figures.same_attempt_twice += duplicates
    live = set(Job.objects.filter(id__in=list(wanted)).values_list("id", flat=True))
    dead_rows = dict(DeadJob.objects.filter(id__in=list(wanted)).values_list("id", "last_error"))
    figures.dead = len(dead_rows)
    for job_id, error in dead_rows.items():
        if not error:
            figures.problems.append(f"dead letter {job_id} has no reason")
    for job_id in wanted - live - set(dead_rows):
        if runs.get(job_id):
            figures.acked += 1
        else:
            figures.problems.append(f"job {job_id} vanished without a run")
    lost_ids = sorted(live | {j for j in wanted - live - set(dead_rows) if not runs.get(j)})
    figures.lost = len(lost_ids)
    if lost_ids:
        figures.problems.append(f"lost jobs (first 10): {lost_ids[:10]}")
    killed = fleet.killed_names() if fleet else set()
    lost_by = fleet.ids_logged(LOST_RE) if fleet else {}
    retried_by = fleet.ids_logged(RETRIED_RE) if fleet else {}
    for job_id, job_runs in runs.items():
        if len(job_runs) < 2:
            continue
        figures.double_run += 1
        for _attempt, worker in sorted(job_runs)[:-1]:
            if worker in killed:
                figures.rerun_after_kill += 1
            elif job_id in lost_by.get(worker, ()):
                figures.rerun_after_lost_claim += 1
            elif job_id in retried_by.get(worker, ()):
                figures.rerun_after_retry += 1
            else:
                figures.unexplained += 1
                figures.problems.append(f"job {job_id}: run by {worker} repeated unexplained")
    if figures.same_attempt_twice:
        figures.problems.append(f"{figures.same_attempt_twice} attempts ran twice")
    if fleet is not None:
        figures.kills = fleet.kills
        figures.restarts = fleet.restarts
    return figures


def settle(figures: Figures, fleet: Fleet, started: float, report: Callable) -> Figures:
    """Record the figures, then fail on anything the accounting found."""
    figures.seconds = round(time.monotonic() - started, 1)
    report(figures)
    assert not figures.problems, "\n".join(figures.problems[:20]) + "\n" + fleet.tail()
    assert figures.lost == 0
    assert figures.unexplained == 0
    assert figures.same_attempt_twice == 0
    return figures


def drained(queues: Sequence[str]) -> Callable[[], bool]:
    """Return a predicate: no live job is left in ``queues``."""
    return lambda: not Job.objects.filter(queue__in=list(queues)).exists()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in {"1", "true", "yes"}


def chaos_long_enabled(config) -> bool:
    """True when the scenarios should soak: ``--chaos-long`` or ``ALKSTORE_CHAOS_LONG=1``."""
    return bool(config.getoption("--chaos-long", default=False)) or env_flag("ALKSTORE_CHAOS_LONG")
