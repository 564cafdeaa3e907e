"""The soak: a steady producer and two workers for an hour; does every alkstore table plateau?

    python bench/run.py --workloads soak [--soak-minutes 60] [--soak-rate 1000]
                                         [--soak-sample-s 60] [--soak-json PATH]
    python -m bench.soak [--minutes ...]          # the same, without run.py

PostgreSQL only, on its own database ``alk_soak_bench`` (``BENCH_SOAK_URL``,
default postgres://postgres@127.0.0.1:5432/alk_soak_bench), dropped and
created afresh. Three real processes, all with ``bench.soak_settings``:

- a producer (``python -m bench.soak produce``) enqueuing ``--soak-rate`` jobs
  a second on ``bench.soak`` with ``enqueue_many`` every 100 ms: 1 % of them
  fail every attempt (retries, then a dead letter), 5 % are enqueued with
  ``keep_result_s`` (a kept result), the rest are no-ops;
- two ``manage.py runworker --queue bench.soak --pool threads`` processes.

The retention periods are short so that an hour passes many of them: the
knobs are the marked dicts of ``bench/soak_settings.py`` (sweep every 15 s;
dead letters, kept results, finished workflows and schedule fires kept 2
minutes, the per-minute counters 10; the attempt history leaves with its
job). The soak prints which of them this tree applied and which it does not
know (an earlier tree).

Pickup latency comes from a side channel: the soak's handler, on a job's first
attempt, appends ``now - enqueued_at`` (ms) to its worker's mark file through a
8 kB buffer (one buffered write per job, no database write); the soak reads
what each file gained since the last sample. Jobs done are the producer's
count (it rewrites a small file each second) minus the rows left in the job
table (pending, processing or waiting for a retry): the jobs acked or
dead-lettered.

Every ``--soak-sample-s`` seconds (default 60) it samples jobs done (in all
and per minute), the p99 pickup of the first attempts started since the last
sample, each worker's resident memory (``VmRSS`` of ``/proc/PID/status``), the
load average, and for every table whose name starts with ``alkstore_`` (the
partitions of a partitioned one summed under their root) the total relation
size, the index size, ``n_dead_tup``, ``n_live_tup`` and ``autovacuum_count``
of ``pg_stat_user_tables``. It prints one row per sample and writes every
sample to a JSON file (default ``.test-db/alk_soak.json``). A sample whose
window saw no pickup flushed (a slow rate against the 8 kB buffers) shows
``-``. The database is left for inspection; the next soak drops it.

The verdict, per table, on its total size: with the samples split in thirds,
the table is *growing* when the median size of the last third is more than
10 % plus 128 kB above the largest of the middle third, else *plateaued*. The
first third is the warm-up (the first retention periods); the 128 kB (16
pages) keeps a tiny table's one new page from counting as growth, and the
median a spike of a sample or two (a burst between two vacuums) that the
table gives back: a table that grows has its whole last third above.

PostgreSQL here runs with ``autovacuum = off`` for the other benches: the
soak turns it on (``ALTER SYSTEM``, reload) for its run and restores the
previous value afterwards in a ``finally``, on Ctrl-C and SIGTERM too (not on
SIGKILL: then run ``ALTER SYSTEM RESET autovacuum; SELECT pg_reload_conf();``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench.soak_settings import SOAK_QUEUE_NAME as QUEUE

ROOT = Path(__file__).resolve().parent.parent
SOAK_URL = os.environ.get("BENCH_SOAK_URL", "postgres://postgres@127.0.0.1:5432/alk_soak_bench")
WORKERS = 2
WORKER_ARGS = ["--pool", "threads", "--concurrency", "8", "--grace-s", "5", "-v", "0"]
# Job n fails every attempt when n % FAIL_EVERY == 0, keeps its result when n % KEEP_EVERY == 1.
FAIL_EVERY = 100
KEEP_EVERY = 20
PRODUCER_TICK_S = 0.1
# The verdict: growing when the last third's median passes
# max(middle third) * GROWTH_RATIO + GROWTH_SLACK_BYTES.
GROWTH_RATIO = 1.10
GROWTH_SLACK_BYTES = 131_072
TABLES_SQL = r"""
SELECT coalesce(pg_partition_root(c.oid), c.oid)::regclass::text,
       sum(pg_total_relation_size(c.oid)), sum(pg_indexes_size(c.oid)),
       sum(coalesce(s.n_dead_tup, 0)), sum(coalesce(s.n_live_tup, 0)),
       sum(coalesce(s.autovacuum_count, 0))
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
  AND c.relname LIKE 'alkstore\_%'
GROUP BY 1 ORDER BY 1
"""


class Stop(Exception):
    """SIGTERM: leave through the ``finally`` blocks, as Ctrl-C does."""


def _raise_stop(signum: int, frame: object) -> None:
    raise Stop(f"signal {signum}")


def produce(rate: int, count_path: str) -> None:
    """Enqueue ``rate`` jobs a second until SIGTERM; rewrite ``count_path`` each second."""
    import django

    django.setup()
    from django.conf import settings

    from alkstore_django import store

    signal.signal(signal.SIGTERM, _raise_stop)
    q = store.queue(QUEUE)
    keep_s = settings.SOAK_KEEP_RESULT_S
    sent = 0
    started = last_report = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            # At most a second's worth per tick: a producer that falls behind says so
            # (``target`` above ``sent``) rather than bursting to catch up.
            due = min(int(rate * (now - started)) - sent, rate)
            if due > 0:
                plain, kept = [], []
                for n in range(sent, sent + due):
                    if n % KEEP_EVERY == 1:
                        kept.append({"n": n})
                    else:
                        plain.append({"n": n, "f": 1} if n % FAIL_EVERY == 0 else {"n": n})
                if plain:
                    q.enqueue_many(plain)
                if kept:
                    q.enqueue_many(kept, keep_result_s=keep_s)
                sent += due
            if now - last_report >= 1:
                last_report = now
                _write_count(count_path, sent, int(rate * (now - started)))
            time.sleep(PRODUCER_TICK_S)
    except Stop:
        _write_count(count_path, sent, int(rate * (time.monotonic() - started)))


def _write_count(path: str, sent: int, target: int) -> None:
    Path(f"{path}.tmp").write_text(json.dumps({"sent": sent, "target": target}))
    os.replace(f"{path}.tmp", path)


def _admin(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(scheme="postgresql"))


def _show(url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(_admin(url)) as conn:
        return str(conn.execute(f"SHOW {name}").fetchone()[0])


def _set_autovacuum(url: str, value: str | None) -> str:
    """ALTER SYSTEM SET (or RESET, for None) autovacuum, reload; return the value now shown."""
    import psycopg

    with psycopg.connect(_admin(url), autocommit=True) as conn:
        if value is None:
            conn.execute("ALTER SYSTEM RESET autovacuum")
        else:
            conn.execute(f"ALTER SYSTEM SET autovacuum = {value}")
        conn.execute("SELECT pg_reload_conf()")
    # The postmaster rereads its files on SIGHUP, a moment later: wait to see it.
    deadline = time.monotonic() + 10
    while True:
        shown = _show(url, "autovacuum")
        if value is None or shown == value or time.monotonic() > deadline:
            return shown
        time.sleep(0.2)


@contextlib.contextmanager
def autovacuum_on(url: str) -> Iterator[str]:
    """Run the block with autovacuum on; restore the previous value even on an interrupt."""
    before = _show(url, "autovacuum")
    try:
        yield f"{_set_autovacuum(url, 'on')} (was {before})"
    finally:
        after = _set_autovacuum(url, None)
        if after != before:
            time.sleep(0.5)
            after = _set_autovacuum(url, before)
        print(f"PostgreSQL autovacuum restored to {after} (was {before} before the run)")


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[max(0, math.ceil(0.99 * len(values)) - 1)]


class MarkReader:
    """Read the pickups a worker's mark file gained since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def read(self) -> list[float]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = self.rest + f.read()
            self.offset = f.tell()
        *lines, self.rest = data.split(b"\n")
        return [float(line) for line in lines if line]


def take_sample(conn, started: float, count_path: Path, readers, workers) -> dict:
    """One sample: the counts, the pickups since the last one, the workers' RSS, the tables."""
    counts = json.loads(count_path.read_text()) if count_path.exists() else {"sent": 0, "target": 0}
    left = conn.execute("SELECT count(*) FROM alkstore_django_job").fetchone()[0]
    pickups = [p for reader in readers for p in reader.read()]
    tables = {
        name: {"total": int(t), "index": int(i), "dead": int(d), "live": int(li), "av": int(a)}
        for name, t, i, d, li, a in conn.execute(TABLES_SQL).fetchall()
    }
    return {
        "t_s": round(time.monotonic() - started, 1),
        "load1": round(os.getloadavg()[0], 2),
        "sent": counts["sent"],
        "target": counts["target"],
        "left": left,
        "done": counts["sent"] - left,
        "pickups": len(pickups),
        "p99_pickup_ms": _p99(pickups),
        "rss_mb": [_rss_mb(w.pid) for w in workers],
        "tables": tables,
    }


def verdicts(samples: list[dict]) -> dict[str, dict]:
    """Per table: first, middle-third max, last-third max and median of its size, the verdict."""
    n = len(samples)
    if n < 3:
        return {}
    middle, last = samples[n // 3 : 2 * n // 3], samples[2 * n // 3 :]
    out = {}
    for name in samples[-1]["tables"]:
        sizes = [s["tables"].get(name, {}).get("total", 0) for s in samples]
        mid_max = max(s["tables"].get(name, {}).get("total", 0) for s in middle)
        last_sizes = [s["tables"].get(name, {}).get("total", 0) for s in last]
        last_max, last_median = max(last_sizes), statistics.median(last_sizes)
        growing = last_median > mid_max * GROWTH_RATIO + GROWTH_SLACK_BYTES
        out[name] = {
            "first": sizes[0],
            "middle_max": mid_max,
            "last_max": last_max,
            "last_median": last_median,
            "dead_max": max(s["tables"].get(name, {}).get("dead", 0) for s in samples),
            "verdict": "growing" if growing else "plateaued",
        }
    return out


def _mb(n: float) -> str:
    return f"{n / 1_048_576:.1f}"


def print_row(s: dict, prev: dict | None) -> None:
    minutes = (s["t_s"] - (prev["t_s"] if prev else 0)) / 60
    per_min = (s["done"] - (prev["done"] if prev else 0)) / minutes if minutes else 0
    total = sum(t["total"] for t in s["tables"].values())
    job = s["tables"].get("alkstore_django_job", {"total": 0, "dead": 0})
    p99 = "-" if s["p99_pickup_ms"] is None else f"{s['p99_pickup_ms']:.0f}"
    rss = "/".join("-" if r is None else f"{r:.0f}" for r in s["rss_mb"])
    print(
        f"{s['t_s'] / 60:>6.1f}{s['done']:>11}{per_min:>10.0f}{s['left']:>8}{p99:>9}"
        f"{rss:>10}{_mb(total):>11}{_mb(job['total']):>9}{job['dead']:>10}{s['load1']:>7.2f}",
        flush=True,
    )


HEADER = (
    f"{'min':>6}{'done':>11}{'done/min':>10}{'left':>8}{'p99 ms':>9}{'RSS MB':>10}"
    f"{'tables MB':>11}{'job MB':>9}{'job dead':>10}{'load':>7}"
)


def run_soak(minutes: float, rate: int, sample_s: float, json_path: Path) -> int:
    """Run the soak; print its rows and verdicts; return 0 when every table plateaued."""
    from bench import soak_settings
    from bench.run import base_env, pg_database

    signal.signal(signal.SIGTERM, _raise_stop)
    url = pg_database(SOAK_URL)
    env = base_env()
    env.update(DJANGO_SETTINGS_MODULE="bench.soak_settings", BENCH_DATABASE_URL=url)
    py = [sys.executable, "-m", "django"]
    subprocess.run([*py, "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    print(f"soak settings applied: {', '.join(soak_settings.SOAK_APPLIED)}")
    skipped = ", ".join(soak_settings.SOAK_SKIPPED) or "none"
    print(f"soak settings this tree does not know (skipped): {skipped}")
    print(f"keep_result_s of the kept 5 %: {soak_settings.SOAK_KEEP_RESULT_S}")
    tmp = Path(tempfile.mkdtemp(prefix="alk_soak_"))
    count_path = tmp / "produced.json"
    samples: list[dict] = []
    load_start = os.getloadavg()
    with autovacuum_on(url) as autovacuum:
        print(f"PostgreSQL autovacuum during the soak: {autovacuum}")
        print(
            f"soak: {minutes:g} min at {rate} jobs/s, {WORKERS} workers "
            f"({' '.join(WORKER_ARGS)}), a sample every {sample_s:g} s; {os.cpu_count()} CPUs"
        )
        procs: list[subprocess.Popen] = []
        try:
            workers = []
            for i in range(WORKERS):
                wenv = {**env, "BENCH_MARK_FILE": str(tmp / f"worker{i}.marks")}
                with (tmp / f"worker{i}.log").open("w") as log:
                    workers.append(
                        subprocess.Popen(
                            [*py, "runworker", "--queue", QUEUE, *WORKER_ARGS],
                            env=wenv,
                            cwd=ROOT,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            procs += workers
            with (tmp / "producer.log").open("w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "bench.soak", "produce", str(rate), str(count_path)],
                        env=env,
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            readers = [MarkReader(tmp / f"worker{i}.marks") for i in range(WORKERS)]
            _sample_loop(url, minutes, sample_s, count_path, readers, workers, procs, samples)
        except (KeyboardInterrupt, Stop) as exc:
            print(f"soak interrupted ({exc or 'Ctrl-C'}) after {len(samples)} samples")
        finally:
            _stop(procs)
    result = {
        "minutes": minutes,
        "rate": rate,
        "sample_s": sample_s,
        "workers": WORKERS,
        "worker_args": WORKER_ARGS,
        "autovacuum": autovacuum,
        "load_start": load_start,
        "load_end": os.getloadavg(),
        "applied": soak_settings.SOAK_APPLIED,
        "skipped": soak_settings.SOAK_SKIPPED,
        "samples": samples,
        "verdicts": verdicts(samples),
        "logs": str(tmp),
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    print_verdicts(result["verdicts"])
    print(f"samples written to {json_path}; worker and producer logs in {tmp}")
    return 0 if all(v["verdict"] == "plateaued" for v in result["verdicts"].values()) else 1


def _sample_loop(url, minutes, sample_s, count_path, readers, workers, procs, samples) -> None:
    """Append a sample to ``samples`` every ``sample_s`` (kept when interrupted) until the end."""
    import psycopg

    started = time.monotonic()
    end = started + minutes * 60
    print(HEADER, flush=True)
    with psycopg.connect(_admin(url), autocommit=True) as conn:
        while True:
            next_at = started + (len(samples) + 1) * sample_s
            time.sleep(max(0.0, min(next_at, end) - time.monotonic()))
            gone = [p.args[3] for p in procs if p.poll() is not None]
            if gone:
                raise SystemExit(f"soak: a process exited early ({gone}): see its log")
            samples.append(take_sample(conn, started, count_path, readers, workers))
            print_row(samples[-1], samples[-2] if len(samples) > 1 else None)
            if time.monotonic() >= end - 0.5:
                return


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def print_verdicts(rows: dict[str, dict]) -> None:
    print(
        f"{'table':<36}{'first MB':>10}{'mid max MB':>12}{'last max MB':>13}"
        f"{'last median MB':>16}{'dead max':>10}  verdict"
    )
    for name, v in rows.items():
        print(
            f"{name:<36}{_mb(v['first']):>10}{_mb(v['middle_max']):>12}"
            f"{_mb(v['last_max']):>13}{_mb(v['last_median']):>16}"
            f"{v['dead_max']:>10}  {v['verdict']}"
        )


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The soak's options (``--soak-minutes`` etc. on run.py, ``--minutes`` etc. here)."""
    parser.add_argument(f"--{prefix}minutes", type=float, default=60.0)
    parser.add_argument(f"--{prefix}rate", type=int, default=1000, help="Jobs enqueued a second.")
    parser.add_argument(f"--{prefix}sample-s", type=float, default=60.0)
    parser.add_argument(f"--{prefix}json", type=Path, default=ROOT / ".test-db" / "alk_soak.json")


def main() -> int:
    if sys.argv[1:2] == ["produce"]:
        produce(int(sys.argv[2]), sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    return run_soak(args.minutes, args.rate, args.sample_s, args.json)


if __name__ == "__main__":
    sys.exit(main())
