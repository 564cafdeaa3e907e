"""The soak's settings (``bench/soak.py``): the bench site with short retention periods.

A one-hour soak must pass several retention periods, so every retention the
soak can set is short. ``SOAK_ALKSTORE``, ``SOAK_QUEUE`` and ``SOAK_KEEP_RESULT_S`` are the knobs:
adjust them here. Keys this tree's ``alkstore_django.conf`` does not know yet
are left out (the package is gaining retention settings): ``SOAK_APPLIED``
and ``SOAK_SKIPPED`` name what was kept and what was not, and the soak prints
both. The soak's producer and its workers all run with this module.
"""

from __future__ import annotations

from alkstore_django.conf import QUEUE_OPTION_NAMES, SETTING_KEYS
from bench.settings import *  # noqa: F403

SOAK_QUEUE_NAME = "bench.soak"
# ---- the soak's knobs: short retention, so an hour passes many periods ----
SOAK_ALKSTORE: dict[str, object] = {
    # Upkeep (expiry, dead-letter purge, attempt history, results) every 15 s.
    "SWEEP_INTERVAL_S": 15,
    "WORKFLOW_RETENTION_S": 120,
    # The retention settings of issue 26 (skipped on an earlier tree). The
    # attempt history has none of its own: it leaves with its job (with its
    # dead letter, or after its ack); kept results go at their keep_result_s.
    "SCHEDULE_FIRE_RETENTION_S": 120,
    "THROUGHPUT_RETENTION_S": 600,
}
SOAK_QUEUE: dict[str, object] = {
    # A failing job dies after 3 attempts, 1 s apart or so, and its dead letter
    # is purged 2 minutes later.
    "max_attempts": 3,
    "retry_base_s": 1,
    "dead_letter_retention_s": 120,
}
# The 5 % of jobs the producer enqueues with ``keep_result_s`` keep it this long.
SOAK_KEEP_RESULT_S = 120
# ---------------------------------------------------------------------------
SOAK_APPLIED = sorted(k for k in SOAK_ALKSTORE if k in SETTING_KEYS) + sorted(
    f"QUEUES[{SOAK_QUEUE_NAME!r}].{k}" for k in SOAK_QUEUE if k in QUEUE_OPTION_NAMES
)
SOAK_SKIPPED = sorted(k for k in SOAK_ALKSTORE if k not in SETTING_KEYS) + sorted(
    f"QUEUES[{SOAK_QUEUE_NAME!r}].{k}" for k in SOAK_QUEUE if k not in QUEUE_OPTION_NAMES
)
ALKSTORE = {
    **ALKSTORE,  # noqa: F405
    **{k: v for k, v in SOAK_ALKSTORE.items() if k in SETTING_KEYS},
    "QUEUES": {
        **ALKSTORE["QUEUES"],  # noqa: F405
        SOAK_QUEUE_NAME: {k: v for k, v in SOAK_QUEUE.items() if k in QUEUE_OPTION_NAMES},
    },
}
