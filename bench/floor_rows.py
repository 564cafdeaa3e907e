"""The floor workload's rows for ``bench/run.py --workloads floor`` (issue 27).

Which commands of ``bench.floors`` (the raw floors) and ``bench.workloads``
(alkstore) a round runs on each engine, the figures each gives, and the
ratios of alkstore to its floor, computed round by round (each round runs
both sides back to back, so a change in the machine's load hits both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from bench.floors import BATCH_ONE_JOBS, MODES, PRODUCER_COUNTS
from bench.placement import PLACEMENTS

FLOOR = "raw floor"
ALKSTORE = "alkstore"
RATIO = "alkstore/floor"
# The pickup floor whose claimed job is started by a second thread (``bench.floors``).
HANDOFF = "raw floor with a thread hand-off"
# The variants of a drain's figures: to the last ack (exits left out), its CPU.
TO_ACK = ", to the last ack"
CPU = ", CPU per job from the first job"
# The producer counts whose client CPU per job is a row: one producer's own
# cost, and eight's, where producers and backends share the machine's cores.
CPU_PRODUCERS = (1, 8)
# The alternating rounds of each ``bench.placement`` run.
PLACEMENT_ROUNDS = 5
# Where the processes can be placed, this many producers run again apart from
# their server processes (``bench.floors producers … apart``), in these modes.
APART_PRODUCERS = 8
APART_MODES = ("floor", "alkstore", "alkstore-waiting")
# A figure: its system, its command (module and arguments), the key of its JSON (a
# dotted path into it), its unit.
Spec = tuple[str, tuple[str, ...], str, str]


class Row(NamedTuple):
    """One figure of the floor workload: its values round by round."""

    name: str
    system: str
    unit: str
    values: list[float]
    target: str = ""
    note: str = ""


def plural(procs: int, what: str = "process") -> str:
    return f"{procs} {what}{('es' if what.endswith('s') else 's') if procs > 1 else ''}"


class Names:
    """The figures' names, shared by ``floor_specs`` and ``floor_derived``."""

    def __init__(self, drain: int, latency: int, producers: int, placed: int = 0) -> None:
        self.drain, self.latency, self.producers = drain, latency, producers
        # The calls of each ``bench.placement`` loop; 0 where the processes cannot
        # be placed, and then neither it nor the producers apart run.
        self.placed = placed

    def fused(self, batch: int, procs: int, variant: str = "") -> str:
        n = min(self.drain, BATCH_ONE_JOBS) if batch == 1 else self.drain
        return f"fused claim+ack {n}, batch {batch}, {plural(procs)}{variant}"

    def drain_(self, procs: int, variant: str = "") -> str:
        return f"drain {self.drain} no-op, {plural(procs)}{variant}"

    def enqueue(self) -> str:
        return f"enqueue one by one ({self.producers} jobs)"

    def pickup(self, p: str) -> str:
        return f"pickup latency {p} ({self.latency} jobs)"

    def producing(self, k: int, mode: str, placement: str = "free") -> str:
        where = "" if placement == "free" else f", {placement}"
        return f"{self.producers} jobs by {plural(k, 'producer')}, {mode}{where}"

    def in_one_process(self, placement: str) -> str:
        return f"enqueue one by one in one process ({self.placed} calls), {placement}"


def floor_specs(engine: str, names: Names) -> dict[str, Spec]:
    """Every figure of the floor workload on ``engine``, floor beside alkstore."""
    floor, ours = "bench.floors", "bench.workloads"
    drain = str(names.drain)
    specs: dict[str, Spec] = {}
    for procs in (1, 4):
        p = str(procs)
        for batch in (1, 32, 100):
            n = str(min(names.drain, BATCH_ONE_JOBS) if batch == 1 else names.drain)
            claim = (floor, "claim", n, p, str(batch))
            specs[names.fused(batch, procs)] = (FLOOR, claim, "rate", "jobs/s")
            specs[names.fused(batch, procs, TO_ACK)] = (FLOOR, claim, "ack_rate", "jobs/s")
            specs[names.fused(batch, procs, CPU)] = (FLOOR, claim, "drain_cpu_us_per_job", "us")
        plain = (ours, "drain", drain, p)
        specs[names.drain_(procs)] = (ALKSTORE, plain, "rate", "jobs/s")
        specs[names.drain_(procs, TO_ACK)] = (ALKSTORE, plain, "ack_rate", "jobs/s")
        specs[names.drain_(procs, ", worker CPU per job")] = (
            ALKSTORE, plain, "cpu_us_per_job", "us",
        )  # fmt: skip
        specs[names.drain_(procs, CPU)] = (
            ALKSTORE, plain, "drain_cpu_us_per_job", "us",
        )  # fmt: skip
        analyzed = (ours, "drain-analyzed", drain, p)
        specs[names.drain_(procs, ", statistics analyzed")] = (ALKSTORE, analyzed, "rate", "jobs/s")
        wide = (ours, "drain", drain, p, "--batch", "100")
        specs[names.drain_(procs, ", --batch 100")] = (ALKSTORE, wide, "rate", "jobs/s")
        specs[names.drain_(procs, f", --batch 100{TO_ACK}")] = (
            ALKSTORE,
            wide,
            "ack_rate",
            "jobs/s",
        )
    n = str(names.producers)
    specs[f"{names.enqueue()}, alkstore"] = (ALKSTORE, (ours, "enqueue", n, "0"), "rate", "jobs/s")
    specs[f"{names.enqueue()}, its statement"] = (FLOOR, (floor, "enqueue", n), "rate", "jobs/s")
    if engine != "postgresql":
        return specs
    pickups = (
        (ALKSTORE, ALKSTORE, "latency"),
        (FLOOR, FLOOR, "listen"),
        (HANDOFF, FLOOR, "listen-handoff"),
    )
    for label, system, command in pickups:
        module = ours if system == ALKSTORE else floor
        for p in ("p50", "p99"):
            latency = (module, command, str(names.latency))
            specs[f"{names.pickup(p)}, {label}"] = (system, latency, f"{p}_ms", "ms")
    for k in PRODUCER_COUNTS:
        for mode in MODES:
            system = FLOOR if mode == "floor" else ALKSTORE
            producers = (floor, "producers", n, str(k), mode)
            specs[names.producing(k, mode)] = (system, producers, "rate", "jobs/s")
            if k in CPU_PRODUCERS:
                cpu = f"{names.producing(k, mode)}, client CPU per job"
                specs[cpu] = (system, producers, "cpu_us_per_job", "us")
    if names.placed:
        # The producers on one CPU and their server processes on the other.
        for mode in APART_MODES:
            system = FLOOR if mode == "floor" else ALKSTORE
            apart = (floor, "producers", n, str(APART_PRODUCERS), mode, "apart")
            specs[names.producing(APART_PRODUCERS, mode, "apart")] = (
                system, apart, "rate", "jobs/s",
            )  # fmt: skip
        # Where the server runs, beside the enqueue's figures (bench/placement.py).
        placement = ("bench.placement", str(names.placed), str(PLACEMENT_ROUNDS))
        for where in PLACEMENTS:
            specs[f"{names.in_one_process(where)}, alkstore / its statement"] = (
                RATIO, placement, f"{where}.ratio", "x",
            )  # fmt: skip
        for system, side in ((ALKSTORE, "alkstore"), (FLOOR, "floor")):
            specs[f"{names.in_one_process('python alone')}, {side}'s own CPU per call"] = (
                system, placement, f"python.{side}.cpu_us", "us",
            )  # fmt: skip
    return specs


def floor_derived(values: dict[str, list[float]], engine: str, names: Names) -> list[Row]:
    """The ratios, round by round: alkstore over its floor, and each side's batch sizes.

    Targets hold on PostgreSQL only; the other engines' ratios are reported.
    """
    pg = engine == "postgresql"
    rows: list[Row] = []

    def ratio(name: str, system: str, a: str, b: str, target: str = "", note: str = "") -> None:
        pairs = zip(values[a], values[b], strict=True)
        rows.append(Row(name, system, "x", [x / y for x, y in pairs], target if pg else "", note))

    for procs in (1, 4):
        p = plural(procs)
        ratio(f"drain / fused floor batch 32, {p}", RATIO, names.drain_(procs),
              names.fused(32, procs), ">= 0.7")  # fmt: skip
        ratio(f"drain / fused floor batch 32, {p}{TO_ACK}", RATIO,
              names.drain_(procs, TO_ACK), names.fused(32, procs, TO_ACK))  # fmt: skip
        # Per-job time, the cycles' own (to the last ack): the inverse of the rates' ratio.
        ratio(f"floor per-job time, batch 100 / batch 32, {p}{TO_ACK}", FLOOR,
              names.fused(32, procs, TO_ACK), names.fused(100, procs, TO_ACK))  # fmt: skip
        ratio(f"alkstore per-job time, --batch 100 / default, {p}{TO_ACK}", ALKSTORE,
              names.drain_(procs, TO_ACK),
              names.drain_(procs, f", --batch 100{TO_ACK}"))  # fmt: skip
        ratio(f"drain, statistics analyzed / fresh, {p}", ALKSTORE,
              names.drain_(procs, ", statistics analyzed"), names.drain_(procs))  # fmt: skip
    ratio(f"CPU per job from the first job, alkstore / floor batch 32, {plural(1)}", RATIO,
          names.drain_(1, CPU), names.fused(32, 1, CPU))  # fmt: skip
    ratio(f"{names.enqueue()}, alkstore / its statement", RATIO, f"{names.enqueue()}, alkstore",
          f"{names.enqueue()}, its statement", ">= 0.9")  # fmt: skip
    if not pg:
        return rows
    for p, target in (("p50", "<= 1.3"), ("p99", "")):
        ratio(f"pickup latency {p}, alkstore / floor", RATIO, f"{names.pickup(p)}, {ALKSTORE}",
              f"{names.pickup(p)}, {FLOOR}", target, "lower is better")  # fmt: skip
    # What the one hop to a handler thread costs on this machine, and alkstore beside it.
    ratio(f"pickup latency p50, {HANDOFF} / floor", FLOOR, f"{names.pickup('p50')}, {HANDOFF}",
          f"{names.pickup('p50')}, {FLOOR}", note="lower is better")  # fmt: skip
    ratio(f"pickup latency p50, alkstore / {HANDOFF}", RATIO, f"{names.pickup('p50')}, {ALKSTORE}",
          f"{names.pickup('p50')}, {HANDOFF}", note="lower is better")  # fmt: skip
    for k in PRODUCER_COUNTS:
        floor, who = names.producing(k, "floor"), plural(k, "producer")
        ratio(f"{who}, alkstore / floor", RATIO, names.producing(k, "alkstore"), floor,
              ">= 0.85" if k == 8 else "")  # fmt: skip
        # A worker of the queue waiting: the coalesced notifications' cost.
        for mode in ("alkstore-waiting", "alkstore-eager"):
            ratio(f"{who}, {mode} / floor", RATIO, names.producing(k, mode), floor)
        if k in CPU_PRODUCERS:
            ratio(f"{who}, client CPU per job, alkstore / floor", RATIO,
                  f"{names.producing(k, 'alkstore')}, client CPU per job",
                  f"{floor}, client CPU per job", note="lower is better")  # fmt: skip
    if names.placed:
        # What the server allows each side's statements when no client takes its core.
        floor = names.producing(APART_PRODUCERS, "floor", "apart")
        who = f"{plural(APART_PRODUCERS, 'producer')} apart from the server"
        for mode in APART_MODES[1:]:
            ratio(f"{who}, {mode} / floor", RATIO,
                  names.producing(APART_PRODUCERS, mode, "apart"), floor)  # fmt: skip
    return rows


def floor_rows(
    engine: str,
    names: Names,
    runs: int,
    run: Callable[[tuple[str, ...]], dict],
    log: Callable[[str], None],
) -> list[Row]:
    """Run the floor workload's commands ``runs`` times, interleaved; return every row.

    Each round runs each distinct command once (a drain gives its rate and
    its CPU), the order reversed on odd rounds, so that the floor and
    alkstore see the same machine; ``run`` runs one command (module and
    arguments) and returns its JSON.
    """
    specs = floor_specs(engine, names)
    values: dict[str, list[float]] = {name: [] for name in specs}
    commands = list(dict.fromkeys(command for _, command, _, _ in specs.values()))
    for round_ in range(runs):
        done = {command: run(command) for command in (commands[::-1] if round_ % 2 else commands)}
        for name, (_, command, key, _) in specs.items():
            value = done[command]
            for part in key.split("."):
                value = value[part]
            values[name].append(value)
        log(f"{engine}: floor round {round_ + 1} of {runs} done")
    rows = [Row(name, system, unit, values[name]) for name, (system, _, _, unit) in specs.items()]
    return rows + floor_derived(values, engine, names)
