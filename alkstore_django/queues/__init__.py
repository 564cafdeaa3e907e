"""Queues: the service a site enqueues through and a worker claims from.

- ``queue``: ``Queue``, a named queue's enqueue, claim, sweep and reads, and
  ``channel_for``, the name of its wake-up channel;
- ``enqueues``: the enqueue paths past the plain insert (unique keys, the
  columns it leaves null), so that the common path reads in one place;
- ``handles``: the fenced ``JobHandle`` a claim hands out (ack, retry, fail,
  heartbeat, release, snooze);
- ``cancels``: ``cancel_job``, a job cancelled wherever it stands.
"""

from __future__ import annotations

from .queue import CHANNEL_PREFIX, Queue, channel_for

__all__ = ["CHANNEL_PREFIX", "Queue", "channel_for"]
