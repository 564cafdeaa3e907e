"""The claim under ``max_running_per_key``: at most so many jobs of one key at once, keys in turn.

It runs inside ``claim_limited``'s transaction, after the queue's control row
is locked, so the keyed claims of a queue take turns over every worker and
host and the counts it reads cannot change under it. One claim:

1. counts the live claims of each key (a lapsed claim does not count);
2. finds the keys with pending jobs, going on from the key after the one the
   last claim stopped at (``QueueControl.key_cursor``) and wrapping round,
   each key found by one index probe (a skip scan written as a recursive
   CTE), so a key with 10,000 pending jobs costs what a key with one does;
3. reads, in one statement, the next due jobs of each key with room (at
   most its room) and of the jobs without a key, which are not limited;
4. takes them round-robin: every key's first job, then every key's second,
   priority and then the key's turn deciding within a round; and claims
   them by id.

A key at its limit is never read past and never holds another key back.
Jobs without a key are not limited; they take their turn as a group, like
one more key that comes first in a round. They are stored with the key
``UNKEYED`` (the empty string, which no caller can give), so that they are in
``alk_job_key`` too: a keyed claim reads nothing but that index's entries of
the keys it serves, however deep the queue. A job left with no key at all
(enqueued before the queue had the limit) is given ``UNKEYED`` by the
workers' upkeep (``adopt_unkeyed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..conf import app_settings
from ..models import QueueControl
from ..records import UNKEYED
from ..records import Job as JobRecord
from .base import JOB_SELECT, JOB_TABLE

if TYPE_CHECKING:
    from .controls import ControlStatements

CONTROL_TABLE = QueueControl._meta.db_table
DUE = "run_at <= {now} AND (expires_at IS NULL OR expires_at > {now})"
# The next key after %s with a pending job: one probe of alk_job_key per key.
NEXT_KEY = (
    f"SELECT j.concurrency_key FROM {JOB_TABLE} j WHERE j.queue = %s AND j.state = 'pending' "
    "AND j.concurrency_key > {after} ORDER BY j.concurrency_key LIMIT 1"
)
KEYS_AFTER = (
    "WITH RECURSIVE k (ckey, depth) AS ("
    f"SELECT ({NEXT_KEY.format(after='%s')}), 1 "
    f"UNION ALL SELECT ({NEXT_KEY.format(after='k.ckey')}), k.depth + 1 FROM k "
    "WHERE k.ckey IS NOT NULL AND k.depth < %s) "
    "SELECT ckey FROM k WHERE ckey IS NOT NULL"
)
HEAD_COLUMNS = "id, priority, run_at, concurrency_key"
# A claim looks at this many keys past the ``n`` it may start, so that a key's
# higher priority job is not passed over for the sake of the rotation alone.
KEY_LOOKAHEAD = 8
# The cursor once the jobs without a key had their turn (None: before it):
# their stored key, which sorts before every other.
UNKEYED_TURN = UNKEYED


def claim_keyed(
    dialect: ControlStatements,
    cursor: Any,
    queue: str,
    worker_id: str,
    n: int,
    per_key: int,
    key_cursor: str | None,
) -> tuple[list[JobRecord], bool]:
    """Claim up to ``n`` jobs of ``queue``, at most ``per_key`` of a key running at once.

    ``key_cursor`` is the control row's, read with its lock. Returns the
    claimed jobs and whether a key at its limit had pending jobs (the
    queue's next claim then waits for a running job to finish).
    """
    now, now_params = dialect.now_sql()
    cursor.execute(
        f"SELECT concurrency_key, count(*) FROM {JOB_TABLE} WHERE queue = %s "
        f"AND state = 'processing' AND claim_expires_at > {now} "
        "AND concurrency_key > %s GROUP BY concurrency_key",
        [queue, *now_params, UNKEYED],
    )
    running = {key: int(count) for key, count in cursor.fetchall()}
    full = {key for key, count in running.items() if count >= per_key}
    wanted = n + KEY_LOOKAHEAD
    turn = [key for key in _turn(cursor, queue, key_cursor, wanted + len(full)) if key not in full]
    turn = turn[: wanted + 1]
    # No key can give one claim more than the claim takes.
    rooms = [(key, n if key is None else min(per_key - running.get(key, 0), n)) for key in turn]
    place = {key: index for index, key in enumerate(turn)}
    heads = _heads(dialect, cursor, queue, rooms)
    # Each key's first job, then each key's second...; within a round the
    # higher priority first, then the key whose turn comes first.
    heads.sort(key=lambda head: (head[2], head[3], place[head[1]], head[4], head[0]))
    picked = heads[:n]
    blocked = bool(full) and _has_pending(cursor, queue, full)
    if not picked:
        return [], blocked
    # The next claim goes on from the key after the last one served here.
    last = turn[max(place[head[1]] for head in picked)]
    moved = UNKEYED_TURN if last is None else last
    if moved != key_cursor:
        cursor.execute(
            f"UPDATE {CONTROL_TABLE} SET key_cursor = %s WHERE queue = %s", [moved, queue]
        )
    return _claim_ids(dialect, cursor, worker_id, [head[0] for head in picked]), blocked


def _turn(cursor: Any, queue: str, key_cursor: str | None, limit: int) -> list[str | None]:
    """Return the keys in the order they take their turn, from the one after ``key_cursor``.

    None stands for the jobs without a key; it comes first in a round (the
    round starts at the lowest key), so after it (``UNKEYED_TURN``) the round
    goes on at the first key. Up to ``limit`` keys, one index probe each.
    """
    if key_cursor is None:
        return [None, *_keys_after(cursor, queue, "", limit)]
    keys: list[str | None] = [*_keys_after(cursor, queue, key_cursor, limit)]
    if len(keys) < limit:
        keys.append(None)
        if key_cursor:
            wrapped = _keys_after(cursor, queue, "", limit - len(keys))
            keys += [key for key in wrapped if key <= key_cursor]
    return keys


def _keys_after(cursor: Any, queue: str, after: str, limit: int) -> list[str]:
    if limit <= 0:
        return []
    cursor.execute(KEYS_AFTER, [queue, after, queue, limit])
    return [row[0] for row in cursor.fetchall()]


def _has_pending(cursor: Any, queue: str, keys: set[str]) -> bool:
    """True when a key of ``keys`` (at their limit) has a pending job waiting for a place."""
    listed = ", ".join(["%s"] * len(keys))
    cursor.execute(
        f"SELECT 1 FROM {JOB_TABLE} WHERE queue = %s AND state = 'pending' "
        f"AND concurrency_key IN ({listed}) LIMIT 1",
        [queue, *sorted(keys)],
    )
    return cursor.fetchone() is not None


def _heads(
    dialect: ControlStatements,
    cursor: Any,
    queue: str,
    rooms: list[tuple[str | None, int]],
) -> list[tuple[int, str | None, int, int, Any]]:
    """Return the due jobs each key may start now, read in one statement.

    Each row is (id, key, its place among its key's jobs, -priority, run_at).
    """
    now, now_params = dialect.now_sql()
    due = DUE.format(now=now)
    parts, params = [], []
    for index, (key, room) in enumerate(rooms):
        parts.append(
            f"SELECT {HEAD_COLUMNS} FROM (SELECT {HEAD_COLUMNS} FROM {JOB_TABLE} "
            f"WHERE queue = %s AND state = 'pending' AND concurrency_key = %s AND {due} "
            f"ORDER BY priority DESC, run_at, id LIMIT %s) AS h{index}"
        )
        params += [queue, UNKEYED if key is None else key, *now_params, *now_params, room]
    cursor.execute(" UNION ALL ".join(parts), params)
    rows = [
        (row[0], row[1], dialect.to_datetime(row[2]), row[3] or None) for row in cursor.fetchall()
    ]
    rows.sort(key=lambda row: (-row[1], row[2], row[0]))
    places: dict[str | None, int] = {}
    heads = []
    for job_id, priority, run_at, key in rows:
        place = places[key] = places.get(key, 0) + 1
        heads.append((job_id, key, place, -priority, run_at))
    return heads


def _claim_ids(
    dialect: ControlStatements, cursor: Any, worker_id: str, ids: list[int]
) -> list[JobRecord]:
    """Claim the pending jobs ``ids`` for ``worker_id`` and return them as claimed."""
    now, now_params = dialect.now_sql()
    match, match_params = dialect.ids_sql(ids)
    cursor.execute(
        f"UPDATE {JOB_TABLE} SET state = 'processing', attempts = attempts + 1, "
        f"generation = generation + 1, worker_id = %s, "
        f"claim_expires_at = {dialect.plus_sql(now, 'visibility_timeout_s')} "
        f"WHERE {match} AND state = 'pending'",
        [worker_id, *now_params, *match_params],
    )
    cursor.execute(
        f"SELECT {JOB_SELECT} FROM {JOB_TABLE} WHERE {match} AND state = 'processing' "
        "AND worker_id = %s",
        [*match_params, worker_id],
    )
    codec = app_settings.payload_codec
    jobs = [dialect.job_from_row(row, codec) for row in cursor.fetchall()]
    jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
    return jobs
