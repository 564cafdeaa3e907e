"""Argument types shared by the commands: bad values are usage errors, never tracebacks.

``argparse`` turns ``ArgumentTypeError`` (and only that, ``ValueError`` and
``TypeError``) raised by a ``type=`` function into a usage error naming the
option: exit status 2 on the command line, ``CommandError`` from
``call_command``. Any other exception escapes the parser as a traceback.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from django.conf import settings


def positive_int(maximum: int | None = None) -> Callable[[str], int]:
    """Return a parser of a whole number from 1 to ``maximum`` (no upper bound when None)."""
    allowed = "a positive integer" if maximum is None else f"a positive integer up to {maximum}"

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1 or (maximum is not None and number > maximum):
            raise argparse.ArgumentTypeError(f"Invalid value {value!r}: expected {allowed}.")
        return number

    return parse


def seconds(maximum: float, *, zero_allowed: bool) -> Callable[[str], float]:
    """Return a parser of a finite number of seconds up to ``maximum`` (``nan``/``inf`` refused).

    ``zero_allowed`` admits 0; negative numbers are always refused. The upper
    bound keeps the value usable as a ``threading.Event.wait`` timeout.
    """
    lowest = "from 0" if zero_allowed else "above 0"

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        low_ok = number >= 0 if zero_allowed else number > 0
        if not (math.isfinite(number) and low_ok and number <= maximum):
            raise argparse.ArgumentTypeError(
                f"Invalid value {value!r}: expected a number of seconds {lowest} up to {maximum:g}."
            )
        return number

    return parse


def database_alias(value: str) -> str:
    """Parse a ``DATABASES`` alias, naming the configured ones when it is unknown."""
    if value not in settings.DATABASES:
        raise argparse.ArgumentTypeError(
            f"Unknown database {value!r}: expected one of "
            f"{', '.join(map(repr, settings.DATABASES))}."
        )
    return value


def add_ids_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """Add ``--id N [N …]`` (repeatable) to ``parser``, collected in ``options["ids"]``."""
    parser.add_argument("--id", dest="ids", type=int, nargs="+", action="extend", help=help_text)


# Django's own options, which BaseCommand adds to the command's parser only:
# argparse refuses them after a subcommand (``alkstore stats -v 0``) unless
# the subcommand's parser knows them too.
COMMON_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("-v", "--verbosity"), {"type": int, "choices": [0, 1, 2, 3]}),
    (("--settings",), {}),
    (("--pythonpath",), {}),
    (("--traceback",), {"action": "store_true"}),
    (("--no-color",), {"action": "store_true"}),
    (("--force-color",), {"action": "store_true"}),
    (("--skip-checks",), {"action": "store_true"}),
)


def accept_common_options(parser: argparse.ArgumentParser) -> None:
    """Let ``parser`` (a subcommand's) take Django's common options after the subcommand too.

    Their defaults are suppressed, so an option given before the subcommand
    keeps its value; ``--settings`` and ``--pythonpath`` are applied by
    ``manage.py`` wherever they stand, this only stops argparse refusing them.
    """
    for flags, kwargs in COMMON_OPTIONS:
        parser.add_argument(*flags, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
