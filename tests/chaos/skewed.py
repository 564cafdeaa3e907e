"""Run a ``manage.py`` command in a process whose clock is skewed (chaos scenario 5).

Usage: ``python -m tests.chaos.skewed SKEW_S COMMAND [ARGS…]``

Before Django starts, ``time.time``/``time.time_ns`` and
``django.utils.timezone.now`` are moved ``SKEW_S`` seconds (an app server
whose clock is wrong). ``time.monotonic`` is left alone: it measures
intervals, not the time of day. The queue must not care, because every
claim decision reads the database's clock.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime


def skew_clock(skew_s: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + skew_s
    time.time_ns = lambda: real_time_ns() + int(skew_s * 1_000_000_000)

    from django.utils import timezone

    timezone.now = lambda: datetime.fromtimestamp(time.time(), tz=UTC)


def main() -> None:
    skew_clock(float(sys.argv[1]))
    from django.core.management import execute_from_command_line

    execute_from_command_line(["django-admin", *sys.argv[2:]])


if __name__ == "__main__":
    main()
