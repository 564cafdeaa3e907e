"""Handlers and backoffs for the custom backoff tests (tests/integration/test_backoff.py).

Each backoff encodes what it saw in the delay it returns, so a test reads
from the job's ``run_at`` alone which callable ran and whether it was given
the exception itself (which the process pool's child must not lose).
"""

from __future__ import annotations

import os

from alkstore_django import handler

# Delays far from the equal-jitter curve of the queues' retry_base_s (at most 2 s here).
HANDLER_DELAY_S = 1000
OPTION_DELAY_S = 2000
TEXT_DELAY_S = 3000
# What exception_aware adds when given the error's text instead of the exception.
GIVEN_TEXT_S = 500
NOT_CALLABLE = 42


class Boom(Exception):
    """The handlers' failure; ``value`` is what ``echo`` returns as the delay."""

    def __init__(self, value: object = None) -> None:
        # The pid tells a test which process raised it (the process pool's child).
        super().__init__(f"boom in pid {os.getpid()}")
        self.value = value


def exception_aware(attempt: int, error: object) -> float:
    """HANDLER_DELAY_S + attempt when given the ``Boom`` itself, else GIVEN_TEXT_S more."""
    base = HANDLER_DELAY_S if isinstance(error, Boom) else HANDLER_DELAY_S + GIVEN_TEXT_S
    return base + attempt


def option_backoff(attempt: int, error: object) -> float:
    """The queue option's backoff: OPTION_DELAY_S, +1 when given an exception."""
    return OPTION_DELAY_S + (1 if isinstance(error, BaseException) else 0)


def text_backoff(attempt: int, error: object) -> float:
    """For a manual ``handle.retry(error)``: TEXT_DELAY_S + len(error) when given text."""
    return TEXT_DELAY_S + (len(error) if isinstance(error, str) else 0)


def raising(attempt: int, error: object) -> float:
    raise RuntimeError("backoff exploded")


def echo(attempt: int, error: object) -> object:
    """Return what the handler's ``Boom`` carries: a bad value for the fallback tests."""
    return error.value if isinstance(error, Boom) else 0


def _fail(job) -> None:
    payload = job.payload if isinstance(job.payload, dict) else {}
    value = payload.get("value")
    if payload.get("huge"):
        value = 10**12
    if payload.get("float"):
        value = float(payload["float"])  # "nan", "inf"
    raise Boom(value)


@handler("b.handler", backoff=exception_aware)
def fails_with_handler_backoff(job) -> None:
    _fail(job)


@handler("b.option")
def fails_plain(job) -> None:
    _fail(job)


@handler("b.raising", backoff=raising)
def fails_with_raising_backoff(job) -> None:
    _fail(job)


@handler("b.echo", backoff=echo)
def fails_with_echo_backoff(job) -> None:
    _fail(job)
