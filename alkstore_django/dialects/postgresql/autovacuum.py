"""Per-table autovacuum settings for the hot tables (migration 0016; docs/scale.md#autovacuum).

PostgreSQL's defaults vacuum a table once a fifth of it is dead
(``autovacuum_vacuum_scale_factor = 0.2``). That suits a table that grows;
a queue table is the opposite: it stays small while every job inserts,
updates (the claim) and deletes (the ack) a row, so its dead tuples are
many times its live rows within a minute, and its size swings with the
backlog. The claim's index scan walks the dead entries a vacuum has not yet
removed, so the vacuum must come by dead-tuple *count*, not by a fraction
of a size that keeps changing: a zero scale factor and a fixed threshold,
with a higher cost limit so one pass finishes quickly. The history and
result tables are append-then-batch-delete: a small scale factor keeps
their pruned batches reused. The counters and the live-worker list are
tiny tables whose rows are rewritten every second or so.

Each value is a storage parameter (``ALTER TABLE … SET``), so a site can
set its own after ``migrate``; reversing the migration ``RESET``s them.
"""

from __future__ import annotations

from typing import Any

from ...models import Attempt, Job, JobResult, LiveWorker, OutcomeMinute, QueueControl

# table -> storage parameters. The threshold is in dead tuples.
AUTOVACUUM: dict[str, dict[str, float | int]] = {
    Job._meta.db_table: {
        "autovacuum_vacuum_scale_factor": 0.0,
        "autovacuum_vacuum_threshold": 5_000,
        "autovacuum_analyze_scale_factor": 0.0,
        "autovacuum_analyze_threshold": 10_000,
        "autovacuum_vacuum_cost_limit": 2_000,
        "autovacuum_vacuum_cost_delay": 1,
    },
    Attempt._meta.db_table: {
        "autovacuum_vacuum_scale_factor": 0.02,
        "autovacuum_vacuum_threshold": 5_000,
        "autovacuum_analyze_scale_factor": 0.02,
        "autovacuum_vacuum_cost_limit": 1_000,
    },
    JobResult._meta.db_table: {
        "autovacuum_vacuum_scale_factor": 0.02,
        "autovacuum_vacuum_threshold": 5_000,
        "autovacuum_analyze_scale_factor": 0.02,
        "autovacuum_vacuum_cost_limit": 1_000,
    },
    OutcomeMinute._meta.db_table: {
        "autovacuum_vacuum_scale_factor": 0.0,
        "autovacuum_vacuum_threshold": 1_000,
    },
    LiveWorker._meta.db_table: {
        "autovacuum_vacuum_scale_factor": 0.0,
        "autovacuum_vacuum_threshold": 200,
    },
    QueueControl._meta.db_table: {
        "autovacuum_vacuum_scale_factor": 0.0,
        "autovacuum_vacuum_threshold": 200,
    },
}


def set_autovacuum(schema_editor: Any) -> None:
    """Set ``AUTOVACUUM``'s storage parameters on each table (names quoted, values ours)."""
    quote = schema_editor.quote_name
    for table, params in AUTOVACUUM.items():
        values = ", ".join(f"{name} = {value}" for name, value in params.items())
        schema_editor.execute(f"ALTER TABLE {quote(table)} SET ({values})")


def reset_autovacuum(schema_editor: Any) -> None:
    """Reset ``AUTOVACUUM``'s parameters to the server's settings (the reverse of ``set``)."""
    quote = schema_editor.quote_name
    for table, params in AUTOVACUUM.items():
        schema_editor.execute(f"ALTER TABLE {quote(table)} RESET ({', '.join(params)})")
