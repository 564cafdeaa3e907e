"""Which enqueue may leave its queue's wake-up out, and when a committed one must ask again.

``Wakeups`` decides on the producer's side (``dialects/postgresql/wakeups.py``);
the worker's claims one and two windows after each wake-up it hears are
tested with a real worker in ``tests/integration/test_coalesced_wakeups.py``.
The times here are the process's monotonic clock, offsets into the past.
"""

from __future__ import annotations

import time

from alkstore_django.dialects.postgresql.wakeups import Wakeups

WINDOW_S = 1.0
CHANNEL = "alk_q_test"


class Asked:
    """Counts the wake-ups a settle asks for (a raise would be logged, not seen)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_quiet__after_a_commit_slower_than_half_the_window__the_next_enqueue_stays_quiet():
    # Under load a commit takes more than half the window. With a single
    # claim a window after each wake-up no enqueue could then be quiet, and
    # every commit notified; the claim two windows after covers it.
    wakeups = Wakeups()
    decided = time.monotonic() - 0.55 * WINDOW_S  # its commit took 0.55 of the window
    wakeups.settle(CHANNEL, decided, quiet=False, woke=True, window_s=WINDOW_S, wake=Asked())
    assert wakeups.quiet(CHANNEL, WINDOW_S, decided + 0.7 * WINDOW_S)
    # Twice that commit time to spare before two windows: not past 0.9.
    assert not wakeups.quiet(CHANNEL, WINDOW_S, decided + 0.95 * WINDOW_S)


def test_quiet__never_more_than_one_window_after_the_last_wake_up():
    wakeups = Wakeups()
    decided = time.monotonic() - 0.01
    wakeups.settle(CHANNEL, decided, quiet=False, woke=True, window_s=WINDOW_S, wake=Asked())
    assert wakeups.quiet(CHANNEL, WINDOW_S, decided + 0.9 * WINDOW_S)
    assert not wakeups.quiet(CHANNEL, WINDOW_S, decided + WINDOW_S)
    assert not Wakeups().quiet(CHANNEL, WINDOW_S, decided)  # no wake-up yet: none covers it


def test_settle__a_quiet_enqueue_is_covered_until_two_windows_after_the_last_wake_up():
    covered, late = Wakeups(), Wakeups()
    covered.committed(CHANNEL, time.monotonic() - 1.5 * WINDOW_S)
    late.committed(CHANNEL, time.monotonic() - 2.5 * WINDOW_S)
    asked_covered, asked_late = Asked(), Asked()
    covered.settle(CHANNEL, time.monotonic() - 0.01, True, False, WINDOW_S, asked_covered)
    late.settle(CHANNEL, time.monotonic() - 0.01, True, False, WINDOW_S, asked_late)
    assert (asked_covered.count, asked_late.count) == (0, 1)


def test_settle__an_enqueue_that_found_no_worker_waiting_is_covered_for_two_windows():
    wakeups = Wakeups()
    asked_covered, asked_late = Asked(), Asked()
    wakeups.settle(
        CHANNEL, time.monotonic() - 1.5 * WINDOW_S, False, False, WINDOW_S, asked_covered
    )
    wakeups.settle(CHANNEL, time.monotonic() - 2.5 * WINDOW_S, False, False, WINDOW_S, asked_late)
    assert (asked_covered.count, asked_late.count) == (0, 1)
