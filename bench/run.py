"""Run every alkstore benchmark on PostgreSQL and SQLite (and, with --peers, the peers).

    python bench/run.py [--peers] [--quick] [--runs N] [--engines postgresql,sqlite,mariadb]
                        [--workloads enqueue,drain,controls,latency,backlog,pools,workflows,
                                     steering,io,floor,soak]
                        [--baseline TREE] [--autovacuum as-is|on]
                        [--soak-minutes 60] [--soak-rate 1000] [--soak-sample-s 60]

Each figure is the median of N runs (default 3) with the min-max; the command
prints one table and one JSON line per figure. It creates and migrates its own
databases: PostgreSQL ``alk_perf_bench`` (``BENCH_PG_URL``, default
postgres://postgres@127.0.0.1:5432/alk_perf_bench; the peers get
``alk_perf_floor``, ``alk_perf_procrastinate`` and ``alk_perf_tasksdb`` on the
same server) and the SQLite file ``.test-db/alk_perf_bench.sqlite3``.
``--peers`` installs procrastinate and django-tasks-db into ``.venv-peers``
(never a dependency of the package) and runs the same workloads on them and on
a raw-psycopg floor (and procrastinate's async worker in the ``io`` rows, on
``<database>_procrastinate``). ``--baseline TREE`` instead runs the enqueue and drain
workloads side by side with an earlier checkout (its own ``alkstore_django``,
on ``<database>_baseline``), alternating run by run, and, when this tree has
workflows, the workflow and kept-result rows on this tree in the same rounds
(and, when it has them, the keyed-drain and progress rows of ``steering``).
See docs/performance.md.

``soak`` is not among the defaults (it lasts an hour): ``--workloads soak``
runs bench/soak.py's soak on PostgreSQL after any other workload named, and
its verdict decides the exit status (see that module and docs/scale.md).
Neither is ``floor`` (some minutes an engine): alkstore's drain, pickup and
enqueue beside the raw driver's floors (``bench/floors.py``), round by round,
with the ratios (``bench/floor_rows.py``).

``--autovacuum on`` runs everything with PostgreSQL's autovacuum on
(``ALTER SYSTEM``, restored afterwards: ``bench.soak.autovacuum_on``); the
default leaves the server as it is. Every PostgreSQL figure's JSON line says
which it was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (``python bench/run.py``), the project's root is not on the path yet.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.settings import DEFAULT_URL  # noqa: E402 (needs the root on the path)

PG_URL = os.environ.get("BENCH_PG_URL", DEFAULT_URL)
MARIADB_URL = os.environ.get("BENCH_MARIADB_URL", "mysql://root@127.0.0.1:3306/alk_perf_bench")
SQLITE_PATH = ROOT / ".test-db" / "alk_perf_bench.sqlite3"
ENGINES = ("postgresql", "sqlite", "mariadb")
PEERS_VENV = ROOT / ".venv-peers"
PEER_REQUIREMENTS = [
    "procrastinate>=3.10,<4",
    "django-tasks-db>=0.13,<0.14",
    "Django>=6.0,<6.2",
    "psycopg[binary]>=3.2",
]


@dataclass
class Figure:
    """One measured figure: its runs, and the target it is held to (if any)."""

    name: str
    system: str
    engine: str
    unit: str
    values: list[float] = field(default_factory=list)
    target: str = ""
    ok: bool | None = None
    note: str = ""
    # PostgreSQL's autovacuum during the run (PostgreSQL figures only).
    autovacuum: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def as_json(self) -> str:
        return json.dumps(
            {
                "figure": self.name,
                "system": self.system,
                "engine": self.engine,
                "unit": self.unit,
                "median": round(self.median, 3),
                "min": round(min(self.values), 3) if self.values else None,
                "max": round(max(self.values), 3) if self.values else None,
                "runs": [round(v, 3) for v in self.values],
                "target": self.target or None,
                "met": self.ok,
                "note": self.note or None,
                **({"autovacuum": self.autovacuum} if self.autovacuum is not None else {}),
            }
        )


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_json(
    command: list[str], env: dict[str, str], timeout_s: float = 600, cwd: Path = ROOT
) -> dict:
    """Run one measurement subprocess; return the JSON object on its last stdout line."""
    done = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def base_env(root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    return env


def pg_database(url: str, name: str | None = None, fresh: bool = True) -> str:
    """(Re)create a PostgreSQL database for the bench; return its URL."""
    import psycopg

    parts = urlsplit(url)
    if name is not None:
        parts = parts._replace(path=f"/{name}")
    db = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{db}"')
    return urlunsplit(parts)


def pg_setting(url: str, name: str) -> str:
    """Return a PostgreSQL server setting (``SHOW``), as the table's header reports it."""
    import psycopg

    with psycopg.connect(urlunsplit(urlsplit(url)._replace(scheme="postgresql"))) as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    return str(row[0]) if row else "?"


def mariadb_database(url: str, name: str | None = None) -> str:
    """(Re)create a MariaDB/MySQL database for the bench; return its URL."""
    import MySQLdb

    parts = urlsplit(url)
    if name is not None:
        parts = parts._replace(path=f"/{name}")
    db = parts.path.lstrip("/")
    conn = MySQLdb.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
    )
    try:
        cursor = conn.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{db}`")
        cursor.execute(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    return urlunsplit(parts)


@dataclass
class Sizes:
    enqueue_one: int
    enqueue_100: int
    enqueue_1000: int
    drain: int
    latency: int
    backlog_small: int
    backlog_large: int
    backlog_jobs: int
    peer_drain: int
    slow_peer_drain: int
    # The middle of the 1 → width → 1 workflow (the 1,000 in both modes: it is short).
    workflow_width: int = 1_000
    # The 50 ms jobs of the io rows at concurrency 200 (about a second at the ideal
    # 4,000 jobs/s), and at the thread pool's default 4 (5 s at its ideal 80 jobs/s).
    io_drain: int = 4_000
    io_drain_narrow: int = 400
    # The floor workload's enqueues: one by one, and by 1 to 8 producers at once.
    floor_producers: int = 4_000
    # Each loop of the floor workload's enqueue in one process (``bench.placement``).
    floor_placed: int = 1_000

    @classmethod
    def for_mode(cls, quick: bool) -> Sizes:
        if quick:
            return cls(
                200, 2_000, 10_000, 3_000, 100, 10_000, 100_000, 200, 500, 200,
                io_drain=2_000, io_drain_narrow=100, floor_producers=2_000, floor_placed=300,
            )  # fmt: skip
        return cls(2_000, 20_000, 50_000, 20_000, 500, 10_000, 1_000_000, 1_000, 3_000, 1_000)


WORKLOADS = (
    "enqueue", "drain", "controls", "latency", "backlog", "pools", "workflows", "steering", "io",
)  # fmt: skip
# Named only: the floors take minutes an engine (bench/floors.py), the soak an hour.
EXTRA_WORKLOADS = ("floor", "soak")
# The workloads --peers runs on the peers (the io rows run procrastinate in their own rounds).
PEER_WORKLOADS = ("enqueue", "drain", "latency")


def side_database(engine: str, url: str, suffix: str) -> str:
    """Create an empty second bench database next to ``url`` (its name + ``suffix``)."""
    name = f"{urlsplit(url).path.lstrip('/')}{suffix}"
    if engine == "postgresql":
        return pg_database(url, name)
    if engine == "mariadb":
        return mariadb_database(url, name)
    path = Path(f"{urlsplit(url).path}{suffix}")
    for ending in ("", "-wal", "-shm"):
        Path(f"{path}{ending}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def alkstore_figures(
    engine: str,
    url: str,
    sizes: Sizes,
    runs: int,
    workloads: tuple[str, ...] = WORKLOADS,
    peers: bool = False,
) -> list[Figure]:
    """Run the alkstore workloads (all of them by default) on one engine.

    With ``peers``, the io rows on PostgreSQL run procrastinate's in the same rounds.
    """
    env = base_env()
    env["BENCH_DATABASE_URL"] = url
    py = [sys.executable, "-m", "bench.workloads"]
    run_json([*py, "migrate"], env)
    figures: list[Figure] = []
    is_pg = engine == "postgresql"

    def add(name: str, unit: str, target: str = "") -> Figure:
        fig = Figure(name, "alkstore", engine, unit, target=target)
        figures.append(fig)
        return fig

    if "enqueue" in workloads:
        one = add("enqueue one by one", "jobs/s")
        b100 = add("enqueue_many(100)", "jobs/s")
        b1000 = add("enqueue_many(1000)", "jobs/s", ">= 20000")
        for _ in range(runs):
            one.values.append(run_json([*py, "enqueue", str(sizes.enqueue_one), "0"], env)["rate"])
            b100.values.append(
                run_json([*py, "enqueue", str(sizes.enqueue_100), "100"], env)["rate"]
            )
            b1000.values.append(
                run_json([*py, "enqueue", str(sizes.enqueue_1000), "1000"], env)["rate"]
            )
        log(f"{engine}: enqueue done")
    if "drain" in workloads:
        drain_target = {"postgresql": ">= 3000", "mariadb": ">= 2000"}.get(engine, "")
        d1 = add(f"drain {sizes.drain} no-op, 1 process", "jobs/s", drain_target)
        d4 = add(f"drain {sizes.drain} no-op, 4 processes", "jobs/s", ">= 6000" if is_pg else "")
        rss = add("worker RSS after drain (peak)", "MB", "< 80")
        for _ in range(runs):
            for procs, fig in ((1, d1), (4, d4)):
                result = run_json([*py, "drain", str(sizes.drain), str(procs)], env)
                fig.values.append(result["rate"])
                if procs == 1:
                    rss.values.append(result["rss_mb"])
        log(f"{engine}: drain done")
    if "controls" in workloads:
        # Queue controls, in one run next to a plain queue: the limited claim
        # path (max_running 16 = the 4 processes' threads; a rate of 3000/s).
        plain = add(f"drain {sizes.drain} no-op, 4 processes, plain queue", "jobs/s")
        limited = add(f"drain {sizes.drain} no-op, 4 processes, max_running 16", "jobs/s")
        rated = add(f"drain {sizes.drain} no-op, 4 processes, rate 3000/s", "jobs/s", "<= 3000")
        for _ in range(runs):
            for queue, fig in (
                ("bench.noop", plain),
                ("bench.limited", limited),
                ("bench.rated", rated),
            ):
                result = run_json([*py, "drain-queue", queue, str(sizes.drain), "4"], env)
                fig.values.append(result["rate"])
        log(f"{engine}: queue controls done")
    if "latency" in workloads:
        p50 = add(f"pickup latency p50 ({sizes.latency} jobs)", "ms", "<= 3" if is_pg else "<= 15")
        p99 = add(f"pickup latency p99 ({sizes.latency} jobs)", "ms", "<= 15" if is_pg else "")
        for _ in range(runs):
            result = run_json([*py, "latency", str(sizes.latency)], env)
            p50.values.append(result["p50_ms"])
            p99.values.append(result["p99_ms"])
        log(f"{engine}: latency done")
    if "backlog" in workloads:
        figures += backlog_figures(engine, url, sizes, runs, env)
        log(f"{engine}: backlog done")
    if "pools" in workloads:
        figures += pool_figures(engine, sizes, runs, env)
        log(f"{engine}: pools done")
    if "workflows" in workloads:
        figures += workflow_figures(engine, sizes, runs, env)
        log(f"{engine}: workflows done")
    if "steering" in workloads:
        figures += steering_figures(engine, sizes, runs, env)
        log(f"{engine}: steering done")
    if "io" in workloads:
        figures += io_figures(engine, url, sizes, runs, env, peers and is_pg)
        log(f"{engine}: io done")
    if "floor" in workloads:
        figures += floor_figures(engine, sizes, runs, env)
        log(f"{engine}: floor done")
    return figures


def floor_figures(engine: str, sizes: Sizes, runs: int, env: dict[str, str]) -> list[Figure]:
    """Issue 27's rows (``bench/floor_rows.py``): alkstore beside the raw floors, interleaved."""
    from bench.floor_rows import Names, floor_rows
    from bench.placement import cannot_place

    def run(command: tuple[str, ...]) -> dict:
        return run_json([sys.executable, "-m", *command], env)

    placed = 0 if cannot_place(env["BENCH_DATABASE_URL"]) else sizes.floor_placed
    names = Names(sizes.drain, sizes.latency, sizes.floor_producers, placed)
    return [
        Figure(row.name, row.system, engine, row.unit, row.values, row.target, note=row.note)
        for row in floor_rows(engine, names, runs, run, log)
    ]


def io_figures(
    engine: str, url: str, sizes: Sizes, runs: int, env: dict[str, str], procrastinate: bool
) -> list[Figure]:
    """Issue 25's rows (``bench/io_bound.py``): 50 ms async jobs, by pool, one round each.

    Each round runs the asyncio pool's drain, the thread pool's (at 200 and
    at 4) and, with ``procrastinate``, procrastinate's worker's, the order
    reversed on odd rounds.
    """
    from bench.io_bound import io_derived, io_workloads

    n, narrow = sizes.io_drain, sizes.io_drain_narrow
    rows = io_workloads(n, narrow, procrastinate)
    drivers = {"alkstore": ([sys.executable, "-m", "bench.workloads"], env)}
    if procrastinate:
        peer_env = dict(env, BENCH_DATABASE_URL=side_database(engine, url, "_procrastinate"))
        peer_env.pop("DJANGO_SETTINGS_MODULE")
        command = [str(ensure_peers_venv()), "-m", "bench.peers.procrastinate_driver"]
        drivers["procrastinate"] = (command, peer_env)
        run_json([*command, "setup"], peer_env)
    figures = {
        name: Figure(name, system, engine, unit) for name, (system, _, _, unit) in rows.items()
    }
    commands = list(dict.fromkeys((system, tuple(args)) for system, args, _, _ in rows.values()))
    for run in range(runs):
        done = {}
        for system, args in reversed(commands) if run % 2 else commands:
            driver, driver_env = drivers[system]
            done[system, args] = run_json([*driver, *args], driver_env)
        for name, (system, args, key, _) in rows.items():
            figures[name].values.append(done[system, tuple(args)][key])
        log(f"{engine}: io round {run + 1} of {runs} done")
    derived = []
    for name, system, unit, values in io_derived(
        {name: fig.values for name, fig in figures.items()}, n, narrow
    ):
        fig = Figure(name, system, engine, unit)
        fig.values = values
        derived.append(fig)
    return [*figures.values(), *derived]


def backlog_figures(
    engine: str, url: str, sizes: Sizes, runs: int, env: dict[str, str]
) -> list[Figure]:
    """Claim+ack behind a small and a large backlog in other queues, and their ratio."""
    py = [sys.executable, "-m", "bench.workloads"]
    small = Figure(
        f"claim+ack, {sizes.backlog_small // 1000}k pending elsewhere", "alkstore", engine,
        "cycles/s",
    )  # fmt: skip
    large = Figure(
        f"claim+ack, {sizes.backlog_large // 1000}k pending + dead elsewhere", "alkstore",
        engine, "cycles/s",
    )  # fmt: skip
    # The two backlogs live in two databases and their runs alternate, so a
    # change in the machine's load (commit latency) hits both alike.
    large_env = dict(env, BENCH_DATABASE_URL=side_database(engine, url, "_backlog"))
    run_json([*py, "migrate"], large_env)
    run_json([*py, "backlog-fill", str(sizes.backlog_small), "0"], env)
    run_json(
        [*py, "backlog-fill", str(sizes.backlog_large), str(sizes.backlog_large)],
        large_env,
        timeout_s=1200,
    )
    for _ in range(runs):
        for fig, fig_env in ((small, env), (large, large_env)):
            result = run_json([*py, "backlog-run", str(sizes.backlog_jobs)], fig_env)
            fig.values.append(result["rate"])
    ratio = Figure(
        "claim+ack slowdown, large/small backlog", "alkstore", engine, "x", target="<= 1.5"
    )
    ratio.values = [s / g for s, g in zip(small.values, large.values, strict=True)]
    return [small, large, ratio]


def pool_figures(engine: str, sizes: Sizes, runs: int, env: dict[str, str]) -> list[Figure]:
    """The process pool next to the thread pool: one worker, ``--concurrency 4`` each.

    Runs alternate between the pools (threads first, then processes first),
    so both see the same load on a shared machine.
    """
    py = [sys.executable, "-m", "bench.workloads"]
    pools = {"threads": "thread pool", "processes": "process pool, 4 children"}
    figures: list[Figure] = []

    def add(pool: str, name: str, unit: str, target: str = "") -> Figure:
        fig = Figure(f"{name}, {pools[pool]}", "alkstore", engine, unit, target=target)
        figures.append(fig)
        return fig

    drain, ack_rate, cpu, parent, child, p50, p99 = ({}, {}, {}, {}, {}, {}, {})
    for pool in pools:
        target = ">= 2000" if pool == "processes" and engine == "postgresql" else ""
        drain[pool] = add(pool, f"drain {sizes.drain} no-op, 1 process", "jobs/s", target)
        ack_rate[pool] = add(pool, "the same, to the last ack", "jobs/s")
        cpu[pool] = add(pool, "worker CPU per job (start-up included)", "us")
        parent[pool] = add(pool, "worker RSS after drain (peak)", "MB")
        if pool == "processes":
            child[pool] = add(pool, "largest child's RSS (peak)", "MB")
        p50[pool] = add(pool, f"pickup latency p50 ({sizes.latency} jobs)", "ms")
        p99[pool] = add(pool, f"pickup latency p99 ({sizes.latency} jobs)", "ms")
    for run in range(runs):
        order = list(pools) if run % 2 == 0 else list(reversed(pools))
        for pool in order:
            args = ["--concurrency", "4", "--pool", pool]
            result = run_json([*py, "drain", str(sizes.drain), "1", *args], env)
            drain[pool].values.append(result["rate"])
            ack_rate[pool].values.append(result["ack_rate"])
            cpu[pool].values.append(result["cpu_us_per_job"])
            parent[pool].values.append(result["parent_rss_mb"])
            if pool in child:
                child[pool].values.append(result["child_rss_mb"])
        for pool in order:
            args = ["--concurrency", "4", "--pool", pool]
            result = run_json([*py, "latency", str(sizes.latency), *args], env)
            p50[pool].values.append(result["p50_ms"])
            p99[pool].values.append(result["p99_ms"])
    gap = Figure(
        "pickup latency p50, process pool minus thread pool", "alkstore", engine, "ms",
        target="<= 2",
    )  # fmt: skip
    gap.values = [
        a - b for a, b in zip(p50["processes"].values, p50["threads"].values, strict=True)
    ]
    return [*figures, gap]


Workloads = dict[str, tuple[list[str], str, str]]  # figure name → (command, result key, unit)


def plain_drain_workloads(sizes: Sizes) -> Workloads:
    """The plain drain's figures, as --baseline and the workflows workload pair them."""
    n = sizes.drain
    one, four = ["drain", str(n), "1"], ["drain", str(n), "4"]
    return {
        f"drain {n} no-op, 1 process": (one, "rate", "jobs/s"),
        f"drain {n} no-op, 1 process, to the last ack": (one, "ack_rate", "jobs/s"),
        f"drain {n} no-op, 1 process, worker CPU per job": (one, "cpu_us_per_job", "us"),
        f"drain {n} no-op, 1 process, CPU per job from the first job": (
            one,
            "drain_cpu_us_per_job",
            "us",
        ),
        f"drain {n} no-op, 4 processes": (four, "rate", "jobs/s"),
        f"drain {n} no-op, 4 processes, to the last ack": (four, "ack_rate", "jobs/s"),
    }


def workflow_workloads(sizes: Sizes) -> Workloads:
    """The rows of issue 23, on this tree only: the drain with kept results, the workflow."""
    n, w = sizes.drain, sizes.workflow_width
    rows: Workloads = {}
    for procs in (1, 4):
        p = f"{procs} process{'es' if procs > 1 else ''}"
        kept = ["drain-kept", str(n), str(procs)]
        rows[f"drain {n}, {p}, keep_result_s"] = (kept, "rate", "jobs/s")
        rows[f"drain {n}, {p}, kept, to the last ack"] = (kept, "ack_rate", "jobs/s")
        if procs == 1:
            rows[f"drain {n}, {p}, kept, worker CPU per job"] = (kept, "cpu_us_per_job", "us")
    for procs in (1, 4):
        p = f"{procs} process{'es' if procs > 1 else ''}"
        # The command's last argument (which half goes first) is added round by round.
        flow = ["workflow", str(w), str(procs)]
        rows[f"workflow 1→{w}→1, {p}, enqueue"] = (flow, "workflow_enqueue_ms", "ms")
        rows[f"workflow 1→{w}→1, {p}, to succeeded"] = (flow, "workflow_ms", "ms")
        rows[f"workflow 1→{w}→1, {p}, fan-in runs"] = (flow, "fanin_runs", "runs")
        rows[f"workflow 1→{w}→1, {p}, fan-in wait"] = (flow, "fanin_wait_ms", "ms")
        rows[f"workflow 1→{w}→1, {p}, root's ack"] = (flow, "root_ack_ms", "ms")
        rows[f"workflow 1→{w}→1, {p}, CPU per step"] = (flow, "workflow_cpu_us_per_step", "us")
        rows[f"{w + 2:,} plain jobs, {p}, enqueue_many"] = (flow, "plain_enqueue_ms", "ms")
        rows[f"{w + 2:,} plain jobs, {p}, to the last ack"] = (flow, "plain_ms", "ms")
        rows[f"{w + 2:,} plain jobs, {p}, CPU per job"] = (flow, "plain_cpu_us_per_step", "us")
    return rows


def run_round(
    workloads: Workloads,
    figures: dict[str, Figure],
    env: dict[str, str],
    run: int,
    cwd: Path = ROOT,
) -> None:
    """Run each command of ``workloads`` once (reversed on odd rounds); append its figures.

    A command gives several figures (a drain: its rate, to the last ack, its
    CPU): it runs once a round.
    """
    py = [sys.executable, "-m", "bench.workloads"]
    done: dict[tuple[str, ...], dict] = {}

    def command(args: list[str]) -> tuple[str, ...]:
        if args[0] == "workflow":
            return (*args, "workflow" if run % 2 == 0 else "plain")
        return tuple(args)

    commands = list(dict.fromkeys(command(args) for args, _, _ in workloads.values()))
    for args in reversed(commands) if run % 2 else commands:
        done[args] = run_json([*py, *args], env, cwd=cwd)
    for name, (args, key, _) in workloads.items():
        figures[name].values.append(done[command(args)][key])


def workflow_derived(fig: dict[str, Figure], sizes: Sizes, engine: str) -> list[Figure]:
    """Per-round differences: what keeping a result costs a job, a workflow step over a job."""
    n, w = sizes.drain, sizes.workflow_width
    rows = []

    def derived(name: str, unit: str, a: Figure, b: Figure, how, target: str = "") -> None:
        row = Figure(name, "alkstore", engine, unit, target=target)
        row.values = [how(x, y) for x, y in zip(a.values, b.values, strict=True)]
        rows.append(row)

    for p in ("1 process", "4 processes"):
        derived(
            f"keep_result_s cost per job, {p}", "us",
            fig[f"drain {n}, {p}, kept, to the last ack"],
            fig[f"drain {n} no-op, {p}, to the last ack"],
            lambda kept, plain: 1e6 / kept - 1e6 / plain,
        )  # fmt: skip
    derived(
        "keep_result_s worker CPU per job, 1 process", "us",
        fig[f"drain {n}, 1 process, kept, worker CPU per job"],
        fig[f"drain {n} no-op, 1 process, worker CPU per job"],
        lambda kept, plain: kept - plain,
    )  # fmt: skip
    for p in ("1 process", "4 processes"):
        flow = fig[f"workflow 1→{w}→1, {p}, to succeeded"]
        plain = fig[f"{w + 2:,} plain jobs, {p}, to the last ack"]
        derived(f"workflow / plain jobs, to the end, {p}", "x", flow, plain, lambda a, b: a / b)
        derived(
            f"workflow cost per step over a job, {p}", "us", flow, plain,
            lambda a, b: (a - b) / (w + 2) * 1e3,
        )  # fmt: skip
    for fanin in (f for name, f in fig.items() if name.endswith("fan-in runs")):
        fanin.target = "== 1"
    return rows


def has_workflows(tree: Path) -> bool:
    return (tree / "alkstore_django" / "workflows").is_dir()


def workflow_figures(engine: str, sizes: Sizes, runs: int, env: dict[str, str]) -> list[Figure]:
    """The kept-result drains next to plain ones, and the workflow next to plain jobs.

    Each round runs the plain drains, the drains with ``keep_result_s`` and
    the workflow command (its two halves alternating which goes first), the
    order of the commands reversed on odd rounds.
    """
    plain = plain_drain_workloads(sizes)
    flows = workflow_workloads(sizes)
    workloads = {**plain, **flows}
    figures = {
        name: Figure(name, "alkstore", engine, unit) for name, (_, _, unit) in workloads.items()
    }
    for name in plain:
        figures[name].note = "paired with the keep_result_s rows"
    for run in range(runs):
        run_round(workloads, figures, env, run)
        log(f"{engine}: workflows round {run + 1} of {runs} done")
    return [*figures.values(), *workflow_derived(figures, sizes, engine)]


def steering_figures(engine: str, sizes: Sizes, runs: int, env: dict[str, str]) -> list[Figure]:
    """Issue 24's rows (``bench/steering.py``) in the same rounds as the plain drains.

    Each round runs the plain drains, the keyed drains, the progress drains
    and the progress calls, the order reversed on odd rounds; the derived
    rows compare each round's keyed or progress drain with its plain one.
    """
    from bench.steering import steering_derived, steering_workloads

    plain = plain_drain_workloads(sizes)
    workloads = {**plain, **steering_workloads(sizes.drain, engine)}
    figures = {
        name: Figure(name, "alkstore", engine, unit) for name, (_, _, unit) in workloads.items()
    }
    for name in plain:
        figures[name].note = "paired with the steering rows"
    for run in range(runs):
        run_round(workloads, figures, env, run)
        log(f"{engine}: steering round {run + 1} of {runs} done")
    return [*figures.values(), *derived_figures(steering_derived(figures, sizes.drain), engine)]


def derived_figures(rows: list[tuple[str, str, list[float]]], engine: str) -> list[Figure]:
    figures = []
    for name, unit, values in rows:
        fig = Figure(name, "alkstore", engine, unit)
        fig.values = values
        figures.append(fig)
    return figures


def baseline_figures(
    engine: str,
    url: str,
    tree: Path,
    sizes: Sizes,
    runs: int,
    workloads: tuple[str, ...] = WORKLOADS,
) -> list[Figure]:
    """Enqueue and drain with this tree and with ``tree`` (an earlier checkout), alternating.

    Both sides run this tree's bench code; the baseline imports its own
    ``alkstore_django`` from a directory that links ``bench`` here and
    ``alkstore_django`` there, on a database of its own (its schema is its
    own). Each round runs every workload on both sides back to back, the side
    that goes first alternating, so a change in the machine's load hits both.
    """
    label = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site = Path(tempfile.mkdtemp(prefix="alkbench-baseline-"))
    (site / "bench").symlink_to(ROOT / "bench")
    (site / "alkstore_django").symlink_to(tree.resolve() / "alkstore_django")
    sides = {
        "alkstore": (ROOT, dict(base_env(), BENCH_DATABASE_URL=url)),
        f"baseline {label}": (
            site,
            dict(base_env(site), BENCH_DATABASE_URL=side_database(engine, url, "_baseline")),
        ),
    }
    expected = {
        "alkstore": (ROOT / "alkstore_django").resolve(),
        f"baseline {label}": (tree / "alkstore_django").resolve(),
    }
    py = [sys.executable, "-m", "bench.workloads"]
    workloads: Workloads = {
        "enqueue one by one": (["enqueue", str(sizes.enqueue_one), "0"], "rate", "jobs/s"),
        "enqueue_many(1000)": (["enqueue", str(sizes.enqueue_1000), "1000"], "rate", "jobs/s"),
        **plain_drain_workloads(sizes),
    }
    figures = {
        (side, name): Figure(name, side, engine, unit)
        for side in sides
        for name, (_, _, unit) in workloads.items()
    }
    # This tree's rows of issues 23 and 24 (the baseline has neither workflows,
    # kept results, keys nor progress), in the same rounds, next to its plain drains.
    from bench.steering import has_steering, steering_derived, steering_workloads

    flows = workflow_workloads(sizes) if has_workflows(ROOT) and "workflows" in workloads else {}
    steer = (
        steering_workloads(sizes.drain, engine)
        if has_steering(ROOT) and "steering" in workloads
        else {}
    )
    mine = {
        name: Figure(name, "alkstore", engine, unit)
        for name, (_, _, unit) in {**flows, **steer}.items()
    }
    try:
        for cwd, env in sides.values():
            run_json([*py, "migrate"], env, cwd=cwd)
        for run in range(runs):
            order = list(sides) if run % 2 == 0 else list(reversed(sides))
            done: dict[tuple[str, tuple[str, ...]], dict] = {}
            for name, (args, key, _) in workloads.items():
                for side in order:
                    cwd, env = sides[side]
                    # A drain gives two figures (to the exit, to the last ack): run it once.
                    result = done.get((side, tuple(args)))
                    if result is None:
                        result = done[side, tuple(args)] = run_json([*py, *args], env, cwd=cwd)
                    imported = Path(result["alkstore_django"]).resolve()
                    if imported != expected[side]:
                        raise SystemExit(f"{side} imported {imported}, not {expected[side]}")
                    figures[side, name].values.append(result[key])
            if mine:
                run_round({**flows, **steer}, mine, sides["alkstore"][1], run)
            log(f"{engine}: baseline round {run + 1} of {runs} done")
    finally:
        for link in site.iterdir():
            link.unlink()
        site.rmdir()
    rows = list(figures.values())
    for name in workloads:
        ours, theirs = figures["alkstore", name], figures[f"baseline {label}", name]
        ratio = Figure(f"{name} vs {label}", "alkstore/baseline", engine, "x", target=">= 0.95")
        # Above 1 is better for alkstore: for CPU time, the ratio is inverted.
        pairs = zip(ours.values, theirs.values, strict=True)
        if ours.unit == "us":
            ratio.values = [b / a for a, b in pairs]
            ratio.note = "baseline / alkstore: above 1 means alkstore uses less"
        else:
            ratio.values = [a / b for a, b in pairs]
        rows.append(ratio)
    plain = {name: figures["alkstore", name] for name in workloads}
    rows += mine.values()
    if flows:
        rows += workflow_derived({**plain, **mine}, sizes, engine)
    if steer:
        rows += derived_figures(steering_derived({**plain, **mine}, sizes.drain), engine)
    return rows


def ensure_peers_venv() -> Path:
    """Create .venv-peers and install the peers into it (once)."""
    python = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / ".bench-ready"
    if marker.exists():
        return python
    log("installing peers into .venv-peers (procrastinate, django-tasks-db)")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True, cwd=ROOT
    )
    marker.write_text("\n".join(PEER_REQUIREMENTS) + "\n")
    return python


def peer_figures(sizes: Sizes, runs: int, alkstore_url: str) -> list[Figure]:
    """The same enqueue, drain and latency workloads on the peers and the floor."""
    figures: list[Figure] = []
    env = base_env()
    python = str(ensure_peers_venv())
    # alkstore's side of the comparisons the targets are about, re-measured run
    # by run in alternation with the peer's, so both see the same machine load.
    ours_env = dict(env, BENCH_DATABASE_URL=alkstore_url)
    ours = [sys.executable, "-m", "bench.workloads"]
    drivers = {
        "raw psycopg floor": ([sys.executable, "-m", "bench.peers.floor"], "alk_perf_floor"),
        "procrastinate": (
            [python, "-m", "bench.peers.procrastinate_driver"],
            "alk_perf_procrastinate",
        ),
        "django-tasks-db": ([python, "-m", "bench.peers.tasksdb_driver"], "alk_perf_tasksdb"),
    }
    for system, (command, db) in drivers.items():
        peer_env = dict(env)
        peer_env["BENCH_DATABASE_URL"] = pg_database(PG_URL, db)
        peer_env["BENCH_ALKSTORE_URL"] = alkstore_url
        peer_env.pop("DJANGO_SETTINGS_MODULE")
        run_json([*command, "setup"], peer_env)
        caps = run_json([*command, "capabilities"], peer_env)
        # The peers drain fewer jobs than alkstore's 20,000, to keep the run bounded;
        # jobs/s are compared as they are.
        n = {"raw psycopg floor": sizes.drain, "procrastinate": sizes.peer_drain}.get(
            system, sizes.slow_peer_drain
        )

        def add(name: str, unit: str, note: str = "", system: str = system) -> Figure:
            fig = Figure(name, system, "postgresql", unit, note=note)
            figures.append(fig)
            return fig

        one = add("enqueue one by one", "jobs/s")
        schema = paired_one = paired_p50 = paired_p99 = None
        if system == "raw psycopg floor":
            schema = add("enqueue one by one, into alkstore's job table", "jobs/s")
            paired_one = Figure("enqueue one by one, paired", "alkstore", "postgresql", "jobs/s")
            figures.append(paired_one)
        if system == "procrastinate":
            paired_p50, paired_p99 = (
                Figure(f"pickup latency {p} ({sizes.latency} jobs), paired", "alkstore",
                       "postgresql", "ms")
                for p in ("p50", "p99")
            )  # fmt: skip
            figures.extend([paired_p50, paired_p99])
        batches = {b: add(f"enqueue_many({b})", "jobs/s") for b in caps.get("batches", [])}
        drains = {p: add(f"drain {n} no-op, {p} process{'es' if p > 1 else ''}", "jobs/s",
                         note=f"{n} jobs") for p in (1, 4)}  # fmt: skip
        lat = caps.get("latency", False)
        p50 = add(f"pickup latency p50 ({sizes.latency} jobs)", "ms") if lat else None
        p99 = add(f"pickup latency p99 ({sizes.latency} jobs)", "ms") if lat else None
        for _ in range(runs):
            if paired_one is not None:
                paired_one.values.append(
                    run_json([*ours, "enqueue", str(sizes.enqueue_one), "0"], ours_env)["rate"]
                )
            if paired_p50 is not None and paired_p99 is not None:
                result = run_json([*ours, "latency", str(sizes.latency)], ours_env)
                paired_p50.values.append(result["p50_ms"])
                paired_p99.values.append(result["p99_ms"])
            one.values.append(
                run_json([*command, "enqueue", str(sizes.enqueue_one), "0"], peer_env)["rate"]
            )
            if schema is not None:
                schema.values.append(
                    run_json([*command, "enqueue-schema", str(sizes.enqueue_one), "0"], peer_env)[
                        "rate"
                    ]
                )
            for b, fig in batches.items():
                size = sizes.enqueue_1000 if b == 1000 else sizes.enqueue_100
                fig.values.append(
                    run_json([*command, "enqueue", str(size), str(b)], peer_env)["rate"]
                )
            for procs, fig in drains.items():
                fig.values.append(
                    run_json([*command, "drain", str(n), str(procs)], peer_env)["rate"]
                )
            if p50 is not None and p99 is not None:
                result = run_json([*command, "latency", str(sizes.latency)], peer_env)
                p50.values.append(result["p50_ms"])
                p99.values.append(result["p99_ms"])
        log(f"{system}: done")
    return figures


def judge(figures: list[Figure]) -> None:
    """Set ``ok`` on the figures with a target, including the ratios to the peers."""
    for fig in figures:
        if not fig.target or not fig.values:
            continue
        op, bound = fig.target.split()
        value = fig.median
        fig.ok = {
            ">=": value >= float(bound),
            "<=": value <= float(bound),
            "==": value == float(bound),
        }.get(op, value < float(bound))


def ratio_rows(figures: list[Figure]) -> list[Figure]:
    """alkstore/peer for every figure both measured on PostgreSQL."""
    ours = {f.name: f for f in figures if f.system == "alkstore" and f.engine == "postgresql"}
    rows = []
    for fig in figures:
        if fig.system == "alkstore" or not fig.values:
            continue
        # Peers drain fewer jobs; compare with our drain of the same process count.
        key = fig.name
        if fig.name.startswith("enqueue one by one"):
            key = "enqueue one by one"
        if fig.name.startswith("drain"):
            key = next((k for k in ours if k.startswith("drain") and k.endswith(
                fig.name.split(",")[-1])), key)  # fmt: skip
        mine = ours.get(f"{key}, paired") or ours.get(key)
        if mine is None or not mine.values:
            continue
        lower_is_better = fig.unit == "ms"
        value = fig.median / mine.median if lower_is_better else mine.median / fig.median
        row = Figure(f"{fig.name} vs {fig.system}", "alkstore/peer", "postgresql", "x")
        row.values = [value]
        if fig.system == "raw psycopg floor" and fig.name.startswith("enqueue one by one"):
            row.target, row.ok = ">= 0.75", value >= 0.75
        if fig.system == "procrastinate" and fig.name.endswith("1 process"):
            row.target, row.ok = ">= 10", value >= 10
        if fig.system == "procrastinate" and fig.unit == "ms":
            row.target, row.ok = ">= 1 (faster)", value >= 1
        row.note = "ms ratio inverted: >1 means alkstore is faster" if lower_is_better else ""
        rows.append(row)
    return rows


def print_table(figures: list[Figure]) -> None:
    # The figure column fits the longest name (issue 24's keyed rows are long).
    width = max([46, *(len(f.name) + 1 for f in figures if f.values)])
    header = f"{'system':<18}{'engine':<11}{'figure':<{width}}{'median':>11}{'min-max':>22}  unit"
    print(header + "      target")
    print("-" * (len(header) + 18))
    for f in figures:
        if not f.values:
            continue
        fmt = "{:.2f}" if f.median < 100 else "{:.0f}"
        spread = f"{fmt.format(min(f.values))}-{fmt.format(max(f.values))}"
        verdict = "" if f.ok is None else ("met" if f.ok else "MISSED")
        target = f"{f.target} {verdict}".strip()
        print(
            f"{f.system:<18}{f.engine:<11}{f.name:<{width}}{fmt.format(f.median):>11}"
            f"{spread:>22}  {f.unit:<10}{target}"
        )


def soak_run(args: argparse.Namespace) -> int:
    """Run bench/soak.py's soak with run.py's ``--soak-*`` options; return its exit status."""
    from bench.soak import run_soak

    return run_soak(args.soak_minutes, args.soak_rate, args.soak_sample_s, args.soak_json)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", action="store_true", help="Also run the peers and the floor.")
    parser.add_argument("--quick", action="store_true", help="Smaller sizes (about 2 minutes).")
    parser.add_argument("--runs", type=int, default=3, help="Runs per figure (at least 3).")
    parser.add_argument("--engines", default="postgresql,sqlite")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"Which workloads to run (default all: {','.join(WORKLOADS)}; also: floor, soak).",
    )
    parser.add_argument(
        "--autovacuum",
        choices=("as-is", "on"),
        default="as-is",
        help="PostgreSQL's autovacuum during the run: as the server has it (default), or on "
        "(ALTER SYSTEM, restored afterwards).",
    )
    from bench.soak import add_arguments as add_soak_arguments
    from bench.soak import autovacuum_on

    add_soak_arguments(parser, prefix="soak-")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="TREE",
        help="Instead: enqueue and drain side by side with the checkout at TREE "
        "(e.g. a git worktree of an earlier commit), alternating run by run.",
    )
    args = parser.parse_args()
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    unknown = sorted(set(workloads) - set(WORKLOADS) - set(EXTRA_WORKLOADS))
    if unknown:
        known = ", ".join(WORKLOADS + EXTRA_WORKLOADS)
        raise SystemExit(f"Unknown workload(s) {unknown}: expected some of {known}.")
    soak = "soak" in workloads
    workloads = tuple(w for w in workloads if w != "soak")
    if soak and not workloads:
        return soak_run(args)
    if args.baseline is not None and not (args.baseline / "alkstore_django").is_dir():
        raise SystemExit(f"--baseline {args.baseline}: no alkstore_django package there.")
    runs = max(3, args.runs)
    sizes = Sizes.for_mode(args.quick)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    # Refused before anything runs: an engine found unknown after the others'
    # rounds lost their figures with it.
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(
            f"Unknown engine(s) {', '.join(map(repr, unknown))}: "
            f"expected some of {', '.join(ENGINES)}."
        )
    uses_pg = "postgresql" in engines or args.peers
    if args.autovacuum == "on" and not uses_pg:
        raise SystemExit("--autovacuum on: this run measures nothing on PostgreSQL.")
    started = time.monotonic()
    load = os.getloadavg()
    # Switched from the server's own database: the bench's is created afresh inside.
    switch = (
        autovacuum_on(urlunsplit(urlsplit(PG_URL)._replace(path="/postgres")))
        if args.autovacuum == "on"
        else contextlib.nullcontext("")
    )
    with switch as switched:
        figures, pg_url = measure(args, engines, workloads, sizes, runs)
        autovacuum = pg_setting(pg_url, "autovacuum") if uses_pg else None
    for fig in figures:
        if fig.engine == "postgresql":
            fig.autovacuum = autovacuum
    judge([f for f in figures if f.system in ("alkstore", "alkstore/baseline", "alkstore/floor")])
    elapsed = time.monotonic() - started
    print(
        f"alkstore bench: {runs} runs per figure, {'quick' if args.quick else 'full'} sizes, "
        f"{os.cpu_count()} CPUs, load average at start {load[0]:.2f} / "
        f"end {os.getloadavg()[0]:.2f}, {elapsed:.0f} s"
    )
    if uses_pg:
        # The drains truncate and vacuum their tables: they do not judge table growth.
        state = f"{switched}, restored after the run" if switched else f"{autovacuum} (as is)"
        print(f"PostgreSQL autovacuum: {state}")
    print_table(figures)
    for fig in figures:
        print(fig.as_json())
    return soak_run(args) if soak else 0


def measure(
    args: argparse.Namespace,
    engines: list[str],
    workloads: tuple[str, ...],
    sizes: Sizes,
    runs: int,
) -> tuple[list[Figure], str]:
    """Create each engine's bench database and run the workloads; return them and the PG URL."""
    figures: list[Figure] = []
    pg_url = PG_URL
    for engine in engines:
        if engine == "postgresql":
            url = pg_url = pg_database(PG_URL)
        elif engine == "mariadb":
            url = mariadb_database(MARIADB_URL)
        else:
            SQLITE_PATH.parent.mkdir(parents=True, exist_ok=True)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)
            url = f"sqlite:///{SQLITE_PATH}"
        log(f"{engine}: starting")
        if args.baseline is not None:
            figures += baseline_figures(engine, url, args.baseline, sizes, runs, workloads)
        else:
            figures += alkstore_figures(engine, url, sizes, runs, workloads, args.peers)
    if args.peers and set(workloads) & set(PEER_WORKLOADS):
        figures += peer_figures(sizes, runs, pg_url)
        figures += ratio_rows(figures)
    return figures, pg_url


if __name__ == "__main__":
    sys.exit(main())
