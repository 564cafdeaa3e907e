"""The scheduler: schedules declared or stored, fired by one elected leader.

``registry`` (validating, storing and declaring schedules), ``fire`` (the
tick: what is due, fired in one transaction, by the misfire policies of
``specs``) and ``leader`` (the lease, the loop and its sleep, ``serve``).
"""

from __future__ import annotations

from ..specs import MISFIRE_GRACE_S
from .fire import REFUSED_RETRY_S, Fire, fired_for, tick
from .leader import LEADER_LOCK, LEADER_TTL_S, STANDBY_RETRY_S, run_schedules, serve
from .registry import (
    SCHEDULE_KEYS,
    check_declaration,
    check_schedule,
    register_declared,
    schedule,
    unschedule,
)

__all__ = [
    "LEADER_LOCK",
    "LEADER_TTL_S",
    "MISFIRE_GRACE_S",
    "REFUSED_RETRY_S",
    "SCHEDULE_KEYS",
    "STANDBY_RETRY_S",
    "Fire",
    "check_declaration",
    "check_schedule",
    "fired_for",
    "register_declared",
    "run_schedules",
    "schedule",
    "serve",
    "tick",
    "unschedule",
]
