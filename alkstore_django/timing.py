"""Pure time arithmetic: duration units and retry backoff (schedule specs are in ``specs.py``)."""

from __future__ import annotations

import math
import random
import re

from .errors import InvalidArgument

BACKOFF_CAP_S = 3600
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
# A queue's rate: '<n>/<unit>', n a positive integer, unit s, m or h.
_RATE_RE = re.compile(r"([1-9][0-9]{0,8})/([smh])")


def parse_rate(rate: object) -> tuple[int, int]:
    """Return (starts, period in seconds) of a queue rate such as ``100/m``.

    Raises ``InvalidArgument`` naming the value for anything else (``0/s``,
    ``1.5/s``, ``10/d``, spaces).
    """
    match = _RATE_RE.fullmatch(rate) if isinstance(rate, str) else None
    if match is None:
        raise InvalidArgument(
            f"Invalid rate {rate!r}: expected '<n>/<unit>' with n a positive integer and "
            "unit s, m or h (for example '100/m')."
        )
    return int(match.group(1)), UNIT_SECONDS[match.group(2)]


def backoff_s(attempt: int, retry_base_s: float, rng: random.Random | None = None) -> int:
    """Return the equal-jitter delay before retry number ``attempt``.

    ``d = min(retry_base_s * 2**(attempt-1), 3600)``; the delay is a uniformly
    random integer in ``[ceil(d/2), d]``.
    """
    # Past 2**64 any positive base exceeds the cap; bounding the exponent keeps
    # the float multiplication finite for absurd attempt counts.
    exponent = min(max(attempt - 1, 0), 64)
    d = min(retry_base_s * 2**exponent, BACKOFF_CAP_S)
    low = math.ceil(d / 2)
    high = max(low, math.floor(d))
    # Jitter spreads retries; it is not security-sensitive.
    return (rng or random).randint(low, high)
