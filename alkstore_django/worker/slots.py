"""What a worker holds under claim, in memory that its sentinel can still read once it died.

A worker's claims are settled from the database's point of view only when an
outcome commits. When the worker process dies first, the database cannot tell
a job that was running from one that was merely prefetched, so it would have
to charge both. These slots record, for each job held, whether its handler
started and whether it returned; the sentinel process (``sentinel.py``)
shares the mapping and settles each held job by what it was. Writes are plain
memory stores, a fraction of a microsecond on the hot path.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
import time

FREE, CLAIMED, RUNNING, RETURNED = 0, 1, 2, 3
# Running past its time limit in a thread that did not stop: the sentinel
# records the attempt as timed out.
TIMED_OUT = 4
# job id, claim generation, state; padded to 24 bytes.
_SLOT = struct.Struct("=qqB7x")


class ClaimSlots:
    """A fixed array of ``capacity`` slots in an anonymous shared mapping.

    Created before the sentinel is forked, so both processes see the same
    pages. ``take`` and ``free`` are called by the worker's main thread only;
    ``mark`` by the handler thread that owns the slot's job at the time.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._map = mmap.mmap(-1, max(capacity, 1) * _SLOT.size)
        self._free = list(range(capacity - 1, -1, -1))

    def take(self, job_id: int, generation: int) -> int:
        """Record a newly claimed job and return its slot."""
        index = self._free.pop()
        _SLOT.pack_into(self._map, index * _SLOT.size, job_id, generation, CLAIMED)
        return index

    def mark(self, index: int, state: int) -> None:
        """Move the slot's job to ``RUNNING``, ``RETURNED`` or ``TIMED_OUT``."""
        # The state byte sits right after the two 8-byte integers.
        self._map[index * _SLOT.size + 16] = state

    def free(self, index: int) -> None:
        """Forget the slot's job: its outcome is durable (or it was released)."""
        self._map[index * _SLOT.size + 16] = FREE
        self._free.append(index)

    def held(self) -> list[tuple[int, int, int]]:
        """Return (job id, generation, state) of every slot in use."""
        found = []
        for index in range(self.capacity):
            job_id, generation, state = _SLOT.unpack_from(self._map, index * _SLOT.size)
            if state != FREE:
                found.append((job_id, generation, state))
        return found


# Two counts in the shared page: the loop's rounds (byte 0), then, after the
# worker's "finished" flag (byte 8), the ticker's ticks (byte 16).
_COUNT = struct.Struct("=q")
_TICKS_AT = 16
# How often the ticker thread counts: often enough that a second without a
# tick means no thread of the process ran.
TICK_S = 0.1


class Pulse:
    """The worker loop's progress, in shared memory its sentinel watches (``sentinel.py``).

    Created before the sentinel is forked. ``beat`` is called once per loop
    round by the main thread (one memory store, not per job); a loop that
    stops beating while jobs are held is stuck, and the sentinel kills it.
    The ticker thread (``start_ticking``) tells the sentinel why: when it
    stops too, no thread runs (a handler holding the GIL); when it goes on,
    the loop waits outside Python (a database lock), which may last until
    just before its claims could lapse. ``finish`` tells the sentinel that
    the worker has stopped on its own: it settles what is left and exits
    without waiting for the worker process to end.
    """

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 24)
        self._rounds = 0
        # The pipe ``finish`` writes to, opened only for a sentinel (``open_finish``).
        self._finish_w: int | None = None

    def open_finish(self) -> int:
        """Open the pipe that ``finish`` writes to (before the fork); return its read end.

        The sentinel waits on it beside the worker's exit, so a worker that
        stops on its own is settled at once rather than at the sentinel's next
        look, a tenth of a second later: a ``runworker --burst`` exits that much
        sooner.
        """
        read_end, self._finish_w = os.pipe()
        return read_end

    def beat(self) -> None:
        """Record one more round of the loop."""
        self._rounds += 1
        _COUNT.pack_into(self._map, 0, self._rounds)

    def start_ticking(self) -> None:
        """Start the thread that counts while any thread of the process can run."""
        threading.Thread(target=self._tick, name="alkstore-pulse", daemon=True).start()

    def _tick(self) -> None:
        ticks = 0
        while not self._map[8]:
            time.sleep(TICK_S)
            ticks += 1
            _COUNT.pack_into(self._map, _TICKS_AT, ticks)

    def finish(self) -> None:
        """Record that the worker has stopped and settled what it could."""
        self._map[8] = 1
        if self._finish_w is not None:
            with contextlib.suppress(OSError):
                os.write(self._finish_w, b"\0")

    def read(self) -> tuple[int, int, bool]:
        """Return (rounds so far, ticks so far, finished)."""
        rounds = _COUNT.unpack_from(self._map, 0)[0]
        return rounds, _COUNT.unpack_from(self._map, _TICKS_AT)[0], bool(self._map[8])
