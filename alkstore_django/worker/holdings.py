"""The jobs a worker holds under claim: by id, their slots, and when each claim is renewed.

The worker's main thread alone reads and changes this; handler threads only
receive a ``Held`` to run and hand back a ``Done``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..executor import Outcome
from ..queues import JobHandle
from .slots import ClaimSlots

logger = logging.getLogger("alkstore_django.worker")

# A claim is renewed when a third of its visibility timeout has passed, so two
# renewals can fail before a running job could be handed to another worker.
HEARTBEAT_FRACTION = 1 / 3


@dataclass
class Held:
    """A job this worker holds a claim on, running or waiting for a thread."""

    handle: JobHandle
    handler: Any
    next_heartbeat_at: float
    slot: int
    # When its handler started (monotonic); None while it waits for a slot.
    started_at: float | None = None


@dataclass
class Done:
    """A held job whose handler has run, and what it decided."""

    held: Held
    outcome: Outcome


class Holdings:
    """Up to ``capacity`` held jobs; ``slots`` mirrors them for the worker's sentinel."""

    def __init__(self, capacity: int) -> None:
        self.slots = ClaimSlots(capacity)
        self._held: dict[int, Held] = {}
        # When the soonest claim needs renewing (monotonic).
        self.next_beat = float("inf")

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Held]:
        """Iterate over a snapshot: the caller may forget jobs meanwhile."""
        return iter(list(self._held.values()))

    def add(self, handle: JobHandle, handler: Any, now: float) -> Held:
        """Hold a newly claimed job; its claim is renewed a third of its timeout from ``now``."""
        job = handle.job
        beat_at = now + job.visibility_timeout_s * HEARTBEAT_FRACTION
        slot = self.slots.take(job.id, job.generation)
        held = Held(handle=handle, handler=handler, next_heartbeat_at=beat_at, slot=slot)
        self.next_beat = min(self.next_beat, beat_at)
        self._held[job.id] = held
        return held

    def forget(self, held: Held, *, reuse_slot: bool = True) -> None:
        """Drop a held job whose outcome is durable (or whose claim is gone).

        The slot of a run abandoned in a stuck thread is not reused: that
        thread may still mark it when (if) its handler returns.
        """
        if self._held.pop(held.handle.job.id, None) is not None and reuse_slot:
            self.slots.free(held.slot)

    def renew_due(self) -> None:
        """Renew every claim whose time has come; stop renewing one that was lost."""
        now = time.monotonic()
        self.next_beat = float("inf")
        for held in self:
            if held.handle.spent:
                continue
            if held.next_heartbeat_at > now:
                self.next_beat = min(self.next_beat, held.next_heartbeat_at)
                continue
            vt = held.handle.job.visibility_timeout_s
            held.next_heartbeat_at = now + vt * HEARTBEAT_FRACTION
            if not held.handle.heartbeat(vt):
                logger.warning(
                    "claim lost id=%s queue=%s attempts=%s: another worker may run it",
                    held.handle.job.id,
                    held.handle.job.queue,
                    held.handle.job.attempts,
                )
                # Stop renewing; the handler's outcome will be logged as lost.
                held.next_heartbeat_at = float("inf")
            self.next_beat = min(self.next_beat, held.next_heartbeat_at)

    def past_time_limit(self, now: float) -> list[Held]:
        """Return the running jobs whose run has passed its ``timeout_s``."""
        return [
            held
            for held in self
            if held.handle.job.timeout_s is not None
            and held.started_at is not None
            and now - held.started_at >= held.handle.job.timeout_s
        ]
