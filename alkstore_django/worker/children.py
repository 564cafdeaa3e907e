"""The process pool: handlers run in child processes the worker supervises.

Python cannot stop a thread, so a handler that hangs, leaks memory or crashes
the interpreter takes a thread-pool worker with it. In the process pool each
of the worker's handler slots drives one child process: the parent keeps the
claims, heartbeats and acks (batched as in the thread pool) and sends the
child one job at a time over a pipe; the child runs the handler and answers
with the outcome. The parent can then

- kill a child whose run passes its time limit (SIGTERM, then SIGKILL after
  ``KILL_GRACE_S``), failing that attempt with ``timed out after N s``;
- fail only the running job's attempt when its child dies (a segfault,
  ``os._exit``, the OOM killer), and start a new child;
- replace a child after ``max_jobs`` jobs or once its resident memory passes
  ``max_memory_mb``.

Children are spawned (``python -m alkstore_django.worker.child``), never forked
from the running worker: each sets Django up itself and opens connections of
its own, so no connection, lock or thread is ever shared across a fork. They
run in a session of their own, so a Ctrl-C in the terminal or a signal to the
worker's process group reaches only the worker, which then stops them in
order. Messages are JSON lines on two dedicated pipes (a handler printing to
stdout cannot corrupt them). A job's payload travels as its column's text
(``Job.stored_payload``), which the child decodes with the payload codec
itself: a codec's decoded values need not be JSON. A child exits when the
worker closes its pipe, or within ``ORPHAN_CHECK_S`` of the worker's death.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import Any

from ..codecs import load_json
from ..conf import app_settings
from ..error_text import describe, timed_out, unrecorded
from ..errors import PayloadError
from ..executor import Outcome, OutcomeKind
from ..records import Job
from ..results import encode_result
from ..runs import Run

logger = logging.getLogger("alkstore_django.worker")

FDS_ENV = "ALKSTORE_CHILD_FDS"
START_TIMEOUT_S = 120.0
KILL_GRACE_S = 2.0
ORPHAN_CHECK_S = 0.2
# How often a child sends its handler's progress to the worker, at most.
CHILD_PROGRESS_S = 0.25
# Without a pidfd, how often a worker waiting for a child's answer checks it is alive.
EXIT_CHECK_S = 0.2
_FIELDS = tuple(f.name for f in dataclasses.fields(Job))
_DATETIME_FIELDS = frozenset(f.name for f in dataclasses.fields(Job) if "datetime" in str(f.type))


def job_to_wire(job: Job) -> dict[str, Any]:
    """Return ``job`` as a JSON-ready dict: datetimes as ISO 8601, the payload as stored.

    The payload is the text its column holds, as the claim read it; a record
    that was not read by a claim carries none, and its payload is encoded
    again with the codec (the text it was stored from).
    """
    wire = {name: getattr(job, name) for name in _FIELDS}
    # A claimed record has no progress (the run reports it); a record a test made may.
    wire["progress"] = None
    for name in _DATETIME_FIELDS:
        if wire[name] is not None:
            wire[name] = wire[name].isoformat()
    stored = job.stored_payload
    if stored is None:
        stored = app_settings.payload_codec.encode(job.payload)
    elif isinstance(stored, bytes | bytearray | memoryview):
        stored = bytes(stored).decode()
    wire["payload"] = stored
    return wire


def job_from_wire(wire: dict[str, Any]) -> Job:
    """Return the Job a ``job_to_wire`` dict describes, its payload decoded with the codec."""
    for name in _DATETIME_FIELDS:
        if wire.get(name) is not None:
            wire[name] = datetime.fromisoformat(wire[name])
    # As a claim reads the column: JSON text, or what a driver already parsed.
    wire["payload"] = app_settings.payload_codec.decode(load_json(wire["payload"]))
    wire["tags"] = tuple(wire["tags"])
    return Job(**wire)


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def describe_exit(returncode: int | None) -> str:
    """Return how a child ended, for an error an operator reads."""
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class ChildGone(Exception):
    """The child process ended (or never answered) while the worker waited for it."""


class Child:
    """One child process and the two pipes the worker speaks to it through."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs = 0
        self.rss_mb = 0.0
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        env = dict(os.environ)
        env[FDS_ENV] = f"{to_child_r},{from_child_w}"
        # The worker's own import path (manage.py puts the project on it).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "alkstore_django.worker.child"],
                env=env,
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        # The child's exit, watched beside the pipe: a process it forked may hold
        # the pipe open long after the child itself is gone.
        self._exit_fd = _open_pidfd(self.process.pid)
        self._buffer = b""
        ready = self._receive(START_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            self.kill()
            raise ChildGone(
                f"child process {name} did not start: it {describe_exit(self.process.poll())}"
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def run(self, job: Job, timeout_s: float | None, run: Run | None = None) -> Outcome:
        """Run ``job`` in the child; return its outcome, a timeout, or the child's death.

        After a timeout or a death the child is gone: the caller starts another.
        The progress the child reports meanwhile is put into ``run``, which
        the worker's main thread writes as it does a thread's.
        """
        started = time.monotonic()
        try:
            _write_all(self._to_child, _encode({"job": job_to_wire(job)}))
        except OSError:
            return self._died(started)
        deadline = None if timeout_s is None else started + timeout_s
        while True:
            answer = self._receive(None if deadline is None else deadline - time.monotonic())
            if answer is None or "progress" not in answer:
                break
            if run is not None:
                run.progress(*answer["progress"])
        if answer is None:
            if timeout_s is not None and self.process.poll() is None:
                self.kill()
                error = timed_out(timeout_s)
                return Outcome(
                    OutcomeKind.RETRY, error=error, duration_ms=(time.monotonic() - started) * 1000
                )
            return self._died(started)
        self.jobs += 1
        self.rss_mb = float(answer.pop("rss_mb", 0.0))
        answer["kind"] = OutcomeKind(answer["kind"])
        return Outcome(**answer)

    def _died(self, started: float) -> Outcome:
        returncode = self._reap()
        error = f"the child process {describe_exit(returncode)} while running this job"
        return Outcome(
            OutcomeKind.RETRY, error=error, duration_ms=(time.monotonic() - started) * 1000
        )

    def _receive(self, timeout_s: float | None) -> dict[str, Any] | None:
        """Return the next message, or None on timeout, end of file or the child's exit."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        watched = [self._from_child] if self._exit_fd is None else [self._from_child, self._exit_fd]
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if self._exit_fd is None:
                # Without a pidfd the exit is polled for.
                wait = EXIT_CHECK_S if wait is None else min(wait, EXIT_CHECK_S)
            readable, _, _ = select.select(watched, [], [], wait)
            if self._from_child not in readable:
                if readable or self.process.poll() is not None:
                    return None  # the child is gone, whoever holds its pipe
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(self._from_child, 65_536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def stop(self) -> None:
        """Let the child finish: it exits when its pipe closes, or is SIGKILLed after the grace."""
        self._close_pipes()
        self.end_by(time.monotonic() + KILL_GRACE_S)

    def tell_cancel(self) -> None:
        """Tell the child its run was asked to cancel (SIGUSR1); safe from another thread."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGUSR1)

    def terminate(self) -> None:
        """Ask the child to stop now; safe from another thread (``run`` then sees it die)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()

    def kill(self) -> None:
        """SIGTERM the child, then SIGKILL it (and its process group) after ``KILL_GRACE_S``."""
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        self.end_by(time.monotonic() + KILL_GRACE_S)
        self._close_pipes()

    def end_by(self, deadline: float) -> None:
        """Wait for the child until ``deadline``, then SIGKILL it; end its process group.

        Safe from another thread than the one in ``run`` (it closes no pipe).
        Whatever the handler started in the child's session (a
        ``multiprocessing`` helper, a daemon) ends with it.
        """
        try:
            self.process.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()
        # The child leads its own group (its session): its id stays the group's while
        # any member lives, so this reaches only what the child started.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def _reap(self) -> int | None:
        try:
            self.end_by(time.monotonic() + KILL_GRACE_S)
            return self.process.returncode
        finally:
            self._close_pipes()

    def _close_pipes(self) -> None:
        for fd in (self._to_child, self._from_child, self._exit_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_child = self._from_child = -1
        self._exit_fd = None


def _open_pidfd(pid: int) -> int | None:
    """Return a descriptor readable once process ``pid`` exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


# --- the child's side ----------------------------------------------------------------


def _rss_mb() -> float:
    """Return this process's resident memory now (its peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(1)


def _checked_value(outcome: Outcome) -> Outcome:
    """Check a kept return value here, as the worker's ack would: the same failure, the same text.

    A value the pipe's JSON cannot carry would otherwise fail with another
    error than the thread pool's (``settle``'s ``PayloadError``).
    """
    try:
        outcome.value = encode_result(outcome.value)
    except PayloadError as exc:
        error = unrecorded(outcome.kind, exc)
        return Outcome(OutcomeKind.RETRY, error=error, duration_ms=outcome.duration_ms)
    return outcome


class ProgressSender:
    """The child's side of a run's progress: sent to the worker as it comes, throttled.

    A handler's report wakes a thread that sends it over the result pipe
    (``{"progress": [done, total, note]}``), at most every
    ``CHILD_PROGRESS_S``; the worker's main thread throttles the writes. The
    value still unsent when the run ends goes ahead of its outcome (``finish``).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        # One writer on the pipe at a time; the run being reported, or None.
        self._lock = threading.Lock()
        self._run: Run | None = None
        self._reported = threading.Event()
        self._sent_at = float("-inf")
        threading.Thread(target=self._serve, name="alkstore-progress", daemon=True).start()

    def start(self, job: Job) -> Run:
        """Return the run of ``job``, whose reports this sends."""
        run = Run(job, self._on_report)
        with self._lock:
            self._run = run
        return run

    def finish(self) -> None:
        """Send the run's unsent progress, then nothing more of it: its outcome is next."""
        with self._lock:
            self._send()
            self._run = None

    def _on_report(self, run: Run) -> None:
        self._reported.set()

    def _serve(self) -> None:
        while True:
            self._reported.wait()
            self._reported.clear()
            time.sleep(max(self._sent_at + CHILD_PROGRESS_S - time.monotonic(), 0.0))
            with self._lock:
                self._send()

    def _send(self) -> None:
        value = None if self._run is None else self._run.take_progress()
        if value is None:
            return
        self._sent_at = time.monotonic()
        # A worker gone is seen by the orphan check; its outcome write fails too.
        with contextlib.suppress(OSError):
            message = {"progress": [value["done"], value["total"], value["note"]]}
            _write_all(self._fd, _encode(message))


def _cancel_current_run(signum: int, frame: Any) -> None:
    """SIGUSR1 from the worker: the job this child runs was asked to cancel.

    Python runs the handler in the main thread, the handler's own, inside
    its run's context: ``current_run()`` is that run (None between jobs).
    """
    from ..runs import current_run

    run = current_run()
    if run is not None:
        run.request_cancel()


def child_main() -> None:
    """Serve the worker jobs until it closes the pipe (Django is set up by ``child.py``)."""
    # The worker decides when a child stops; a terminal's Ctrl-C is the worker's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before "ready": SIGUSR1's default action would end the child.
    signal.signal(signal.SIGUSR1, _cancel_current_run)
    parent = os.getppid()
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
    jobs_r, results_w = (int(fd) for fd in os.environ[FDS_ENV].split(","))
    from ..executor import run_job, settles_alone
    from ..handlers import registry

    progress = ProgressSender(results_w)
    _write_all(results_w, _encode({"ready": True}))
    with os.fdopen(jobs_r, "rb") as jobs:
        for line in jobs:
            job = job_from_wire(json.loads(line)["job"])
            func = registry.get(job.queue)
            if func is None:
                error = f"no handler for queue {job.queue!r} in the child"
                outcome = Outcome(OutcomeKind.RETRY, error=error)
            else:
                outcome = run_job(func, job, progress.start(job))
                progress.finish()
            if outcome.kind == OutcomeKind.ACK and (
                job.workflow_id is not None or job.keep_result_s is not None
            ):
                outcome = _checked_value(outcome)
            snooze = outcome.kind == OutcomeKind.SNOOZE
            answer = {
                "kind": outcome.kind,
                # Only a result kept (by a hook, a workflow step, keep_result_s; JSON
                # there) and a snooze's delay need the value.
                "value": outcome.value if settles_alone(func, job) or snooze else None,
                "error": outcome.error,
                "exc_class": outcome.exc_class,
                "traceback": outcome.traceback,
                "duration_ms": outcome.duration_ms,
                # The backoff was asked here, where the handler's exception exists.
                "delay_s": outcome.delay_s,
                "rss_mb": _rss_mb(),
            }
            try:
                message = _encode(answer)
            except (TypeError, ValueError) as exc:
                answer["kind"], answer["value"] = OutcomeKind.RETRY, None
                answer["error"] = f"the result could not be sent to the worker: {describe(exc)}"
                message = _encode(answer)
            _write_all(results_w, message)
