"""The tables, one module per noun. Declarative only: state changes live in the services.

- ``jobs``: live jobs, dead letters, unique windows, failed attempts, the overview's proxy;
- ``workflows``: workflows, their steps, kept job results;
- ``schedules``: schedules and the boundaries they fired for;
- ``coordination``: leases, queue controls, messages, throughput counters, live workers;
- ``tasks``: the Django Tasks backend's results.

Everything is re-exported here: ``alkstore_django.models`` is the app's models module.
"""

from __future__ import annotations

from .coordination import ChannelMessage, LiveWorker, Lock, OutcomeMinute, QueueControl
from .jobs import (
    NAME_MAX_LENGTH,
    Attempt,
    DeadJob,
    Job,
    JobQuerySet,
    JobStamps,
    JobState,
    QueueOverview,
    UniqueWindow,
)
from .schedules import Schedule, ScheduleFire
from .tasks import TaskResult, TaskStatus
from .workflows import (
    JobResult,
    ResultState,
    StepState,
    Workflow,
    WorkflowState,
    WorkflowStep,
)

__all__ = [
    "NAME_MAX_LENGTH",
    "Attempt",
    "ChannelMessage",
    "DeadJob",
    "Job",
    "JobQuerySet",
    "JobResult",
    "JobStamps",
    "JobState",
    "LiveWorker",
    "Lock",
    "OutcomeMinute",
    "QueueControl",
    "QueueOverview",
    "ResultState",
    "Schedule",
    "ScheduleFire",
    "StepState",
    "TaskResult",
    "TaskStatus",
    "UniqueWindow",
    "Workflow",
    "WorkflowState",
    "WorkflowStep",
]
