"""Workflows as the API offers them: enqueue one, read it, list them, cancel one."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from .. import records, tracing
from ..conf import app_settings
from ..errors import InvalidWorkflow
from ..models import Job, StepState, WorkflowState, WorkflowStep
from ..models import Workflow as WorkflowRow
from ..validation import encode_payload, validate_int
from .graph import Workflow
from .progress import lock, release

if TYPE_CHECKING:
    from ..store import Store

WORKFLOW_STATES = tuple(WorkflowState.values)


def enqueue_workflow(store: Store, workflow: Workflow) -> int:
    """Write ``workflow`` and release its first steps; return its id.

    Everything is checked first (the graph, each step's queue, options and
    payload), so a bad workflow writes nothing. Inside ``atomic()`` it joins
    the caller's transaction: a rollback leaves no row of it.
    """
    store.check_open()
    if not isinstance(workflow, Workflow):
        raise InvalidWorkflow(
            f"Invalid workflow {workflow!r}: expected an alkstore_django.Workflow."
        )
    order = workflow.check()
    limit, to_json = app_settings.max_payload_bytes, app_settings.payload_codec.encode
    encoded: dict[str, str] = {}
    for name in order:
        step = workflow.steps[name]
        # The step's job is an ordinary job of its queue: its options are checked as enqueue's.
        queue = store.queue(step.queue)
        if queue.store.using != store.using:
            # Steps move each other in the workflow's transactions: one database.
            raise InvalidWorkflow(
                f"Invalid step {name!r}: its queue {step.queue!r} lives on database "
                f"{queue.store.using!r}, the workflow on {store.using!r}: a workflow's "
                "steps run on queues of its database."
            )
        queue.check_options(step.options)
        encoded[name] = encode_payload(step.payload, limit, to_json)
    dependants = workflow.dependants()
    using = store.using
    # The steps released now are enqueued inside it, those released later under its context.
    span = tracing.start_workflow(workflow.name, len(order))
    with span or nullcontext(), store.dialect.atomic_write():
        row = WorkflowRow.objects.using(using).create(
            name=workflow.name,
            steps_total=len(order),
            steps_open=len(order),
            trace_context=span.carrier if span is not None else None,
        )
        if span is not None:
            span.set("alkstore.workflow.id", row.id)
        steps = [
            WorkflowStep(
                workflow=row,
                name=name,
                queue=workflow.steps[name].queue,
                payload=encoded[name],
                options=workflow.steps[name].options,
                after=list(workflow.steps[name].after),
                dependants=dependants[name],
                run_on_upstream_failure=workflow.steps[name].on_upstream_failure == "run",
                state=StepState.WAITING,
                blocked_by=len(workflow.steps[name].after),
            )
            for name in order
        ]
        release(store, row.id, [s for s in steps if s.blocked_by == 0])
        WorkflowStep.objects.using(using).bulk_create(steps, batch_size=500)
    return row.id


def get_workflow(store: Store, workflow_id: int) -> records.Workflow | None:
    """Return the workflow with its steps as they stand, or None. A pure read.

    A pending step whose job is under a claim reads ``processing``.
    """
    store.check_open()
    validate_int("workflow id", workflow_id, minimum=-(2**63), maximum=2**63 - 1)
    using = store.using
    row = WorkflowRow.objects.using(using).filter(id=workflow_id).first()
    if row is None:
        return None
    steps = list(WorkflowStep.objects.using(using).filter(workflow=row).order_by("id"))
    pending = [s.job_id for s in steps if s.state == StepState.PENDING and s.job_id is not None]
    running = set(
        Job.objects.using(using)
        .filter(id__in=pending, state="processing")
        .values_list("id", flat=True)
    )
    return _record(row, steps, running)


def list_workflows(
    store: Store, *, state: str | None = None, limit: int = 100
) -> list[records.Workflow]:
    """Return the newest workflows (of ``state``, when given), without their steps' results."""
    store.check_open()
    if state is not None and state not in WORKFLOW_STATES:
        raise InvalidWorkflow(
            f"Invalid workflow state {state!r}: expected one of {', '.join(WORKFLOW_STATES)}."
        )
    rows = WorkflowRow.objects.using(store.using).order_by("-id")
    if state is not None:
        rows = rows.filter(state=state)
    return [_record(row, [], set()) for row in rows[: validate_int("limit", limit, minimum=1)]]


def cancel_workflow(store: Store, workflow_id: int) -> bool:
    """Cancel every step of the workflow that has not finished; False if it had already ended.

    Waiting steps are cancelled and the jobs of pending ones deleted, in one
    transaction. A handler already running is not interrupted: its ack finds
    its job gone and changes nothing.
    """
    store.check_open()
    validate_int("workflow id", workflow_id, minimum=-(2**63), maximum=2**63 - 1)
    using = store.using
    with store.dialect.atomic_write():
        locked = lock(using, [workflow_id])
        if not locked or locked[0].state != WorkflowState.RUNNING:
            return False
        row = locked[0]
        now = store.dialect.database_now()
        open_steps = WorkflowStep.objects.using(using).filter(
            workflow=row, state__in=[StepState.WAITING, StepState.PENDING]
        )
        job_ids = [j for j in open_steps.values_list("job_id", flat=True) if j is not None]
        Job.objects.using(using).filter(id__in=job_ids).delete()
        open_steps.update(
            state=StepState.CANCELLED,
            error="cancelled: the workflow was cancelled",
            finished_at=now,
        )
        row.state, row.steps_open, row.finished_at = WorkflowState.CANCELLED, 0, now
        row.save(update_fields=["state", "steps_open", "finished_at"])
    return True


def _record(row: WorkflowRow, steps: list[WorkflowStep], running: set[int]) -> records.Workflow:
    return records.Workflow(
        id=row.id,
        name=row.name,
        state=row.state,  # type: ignore[arg-type]
        steps={s.name: _step_record(s, running) for s in steps},
        created_at=row.created_at,
        finished_at=row.finished_at,
        steps_total=row.steps_total,
        steps_open=row.steps_open,
    )


def _step_record(step: WorkflowStep, running: set[int]) -> records.WorkflowStep:
    state: Any = step.state
    if state == StepState.PENDING and step.job_id in running:
        state = "processing"
    return records.WorkflowStep(
        name=step.name,
        queue=step.queue,
        state=state,
        after=tuple(step.after),
        job_id=step.job_id,
        result=step.result,
        error=step.error,
        finished_at=step.finished_at,
        run_on_upstream_failure=step.run_on_upstream_failure,
    )
