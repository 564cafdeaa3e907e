"""A workflow's steps move on: released, finished, cancelled, resumed; one lock order for all.

Every change to a workflow's steps runs in one transaction that locks the
workflow's row first (``lock``). That row lock is what makes a fan-in exact:
the transactions acking its N parents take turns, each sees the count the
previous one left, and only the one that brings it to zero releases the
step. It also fixes the order in which locks are taken (workflow, then
job), so an ack and a cancel of the same workflow cannot deadlock.

The worker's outcome transaction calls ``finish_step`` (executor.settle),
so a step's ack and the release of what waited on it commit together.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from .. import results, tracing
from ..conf import app_settings
from ..models import (
    DeadJob,
    Job,
    ResultState,
    StepState,
    Workflow,
    WorkflowState,
    WorkflowStep,
)
from ..signals import job_enqueued

if TYPE_CHECKING:
    from ..store import Store

logger = logging.getLogger("alkstore_django.workflows")

FINISHED = frozenset({StepState.SUCCEEDED, StepState.FAILED, StepState.CANCELLED})
# The error of a step cancelled because a step it waited on failed: a requeue
# of that step lets it wait again (a step cancelled with its workflow stays so).
UPSTREAM_PREFIX = "cancelled: upstream step "


def lock(using: str, workflow_ids: Iterable[int]) -> list[Workflow]:
    """Lock the workflows' rows, lowest id first, for the rest of the caller's transaction."""
    ids = sorted(set(workflow_ids))
    if not ids:
        return []
    return list(Workflow.objects.using(using).select_for_update().filter(id__in=ids).order_by("id"))


def release(
    store: Store,
    workflow_id: int,
    steps: Sequence[WorkflowStep],
    trace_context: str | None = None,
) -> None:
    """Enqueue the jobs of ``steps`` (their parents are done) and mark the steps pending.

    One insert per queue and options, then one update that names each job's
    workflow and step: a fan-out of a thousand steps costs a few statements,
    not a thousand. The caller saves the steps (``job_id``, ``state``).
    Traced, each insert's enqueue span is a child of ``trace_context`` (the
    workflow's), else of the current span.
    """
    groups: dict[tuple[str, str], list[WorkflowStep]] = defaultdict(list)
    for step in steps:
        groups[step.queue, repr(sorted(step.options.items()))].append(step)
    marks: list[Job] = []
    for (queue_name, _), members in groups.items():
        queue = store.queue(queue_name)
        payloads, options = [s.payload for s in members], members[0].options
        span = tracing.start_enqueue(queue_name, len(members), parent=trace_context)
        if span is None:
            ids = queue.write_encoded(payloads, options)
        else:
            with span:
                stamps = replace(queue.check_options(options), trace_context=span.carrier)
                ids = queue.write_encoded(payloads, options, stamps=stamps)
                span.set("alkstore.workflow.id", workflow_id)
                span.sent(ids)
        for step, job_id in zip(members, ids, strict=True):
            step.job_id, step.state = job_id, StepState.PENDING
            marks.append(Job(id=job_id, workflow_id=workflow_id, step=step.name))
        if job_enqueued.receivers:
            job_enqueued.send(queue_name, job_ids=ids)
    Job.objects.using(store.using).bulk_update(marks, ["workflow_id", "step"], batch_size=500)


def finish_step(
    store: Store,
    workflow: Workflow,
    name: str,
    job_id: int,
    state: StepState,
    *,
    result: Any = None,
    error: str | None = None,
) -> bool:
    """Record that step ``name`` ended ``state``, then move its dependants on; False if stale.

    The caller holds ``workflow``'s lock. A dependant whose parents have all
    succeeded is released; one with a failed or cancelled parent is cancelled
    (and its own dependants after it), unless it runs on upstream failure,
    in which case it is released once its parents have all finished. The
    workflow ends once no step is left open. Stale: the step is no longer
    waiting for that job (the workflow was cancelled, or the job is an old one).
    """
    using = store.using
    step = (
        WorkflowStep.objects.using(using)
        .select_for_update()
        .filter(workflow_id=workflow.id, name=name)
        .only("id", "name", "state", "job_id", "dependants")
        .first()
    )
    if step is None or step.state != StepState.PENDING or step.job_id != job_id:
        return False
    # The database's clock, in the statements themselves: no round trip to read it.
    now = Now()
    step.state, step.result, step.error, step.finished_at = state, result, error, now
    step.save(update_fields=["state", "result", "error", "finished_at"])
    closed = 1 + _move_dependants(store, workflow, [(step, state)], now)
    _close(using, workflow, closed, now)
    return True


def _move_dependants(
    store: Store, workflow: Workflow, finished: list[tuple[WorkflowStep, str]], now: Now
) -> int:
    """Pass each finished step's end to its waiting dependants; return how many steps closed."""
    workflow_id = workflow.id
    closed = 0
    changed: dict[int, WorkflowStep] = {}
    to_release: list[WorkflowStep] = []
    steps = WorkflowStep.objects.using(store.using).select_for_update()
    while finished:
        parent, parent_state = finished.pop()
        if not parent.dependants:
            continue
        # A fan-in's row names its thousand parents: what is not moved here stays unread.
        children = (
            steps.filter(
                workflow_id=workflow_id, name__in=parent.dependants, state=StepState.WAITING
            )
            .defer("after", "result")
            .order_by("id")
        )
        for child in children:
            child = changed.get(child.id, child)
            if child.state != StepState.WAITING:
                continue
            child.blocked_by -= 1
            if parent_state != StepState.SUCCEEDED:
                child.upstream_failed = True
            changed[child.id] = child
            if child.upstream_failed and not child.run_on_upstream_failure:
                child.state, child.finished_at = StepState.CANCELLED, now
                child.error = f"{UPSTREAM_PREFIX}{parent.name!r} {parent_state}"
                closed += 1
                finished.append((child, StepState.CANCELLED))
            elif child.blocked_by == 0:
                # Marked at once, so a second parent in this loop cannot release it again.
                child.state = StepState.PENDING
                to_release.append(child)
    if to_release:
        release(store, workflow_id, to_release, workflow.trace_context)
    _save(store.using, list(changed.values()), to_release)
    return closed


def _save(using: str, steps: list[WorkflowStep], released: list[WorkflowStep]) -> None:
    """Write the steps' moves: one update per set of equal values, then the released jobs' ids.

    A step's move is one of a few shapes (a count down, cancelled, released),
    so a fan-out of a thousand steps is a few statements; ``bulk_update``'s
    per-row ``CASE`` cost milliseconds of Python for every step's ack.
    """
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for step in steps:
        # Finished in this transaction (the clock's expression), or as it was.
        finished = "now" if isinstance(step.finished_at, Now) else step.finished_at
        key = (step.state, step.blocked_by, step.upstream_failed, step.error, finished)
        groups[key].append(step.pk)
    rows = WorkflowStep.objects.using(using)
    for (state, blocked_by, upstream_failed, error, finished), ids in groups.items():
        rows.filter(pk__in=ids).update(
            state=state,
            blocked_by=blocked_by,
            upstream_failed=upstream_failed,
            error=error,
            finished_at=Now() if finished == "now" else finished,
        )
    if released:
        rows.bulk_update(released, ["job_id"], batch_size=500)


def _close(using: str, workflow: Workflow, closed: int, now: Now) -> None:
    """Count ``closed`` steps off the workflow's open ones; end it when none is left."""
    workflow.steps_open = max(workflow.steps_open - closed, 0)
    fields = ["steps_open"]
    if workflow.steps_open == 0 and workflow.state == WorkflowState.RUNNING:
        ended = set(
            WorkflowStep.objects.using(using)
            .filter(workflow_id=workflow.id)
            .values_list("state", flat=True)
            .distinct()
        )
        if StepState.FAILED in ended:
            workflow.state = WorkflowState.FAILED
        elif StepState.CANCELLED in ended:
            workflow.state = WorkflowState.CANCELLED
        else:
            workflow.state = WorkflowState.SUCCEEDED
        workflow.finished_at = now
        fields += ["state", "finished_at"]
        logger.info("workflow finished id=%s state=%s", workflow.id, workflow.state)
    workflow.save(update_fields=fields)


def jobs_gone(store: Store, rows: Sequence[dict[str, Any]]) -> None:
    """Finish the steps whose jobs left without an outcome of their own (cancelled, swept).

    ``rows`` are the jobs' (``id``, ``workflow_id``, ``step``) as read before
    they left; the caller holds their workflows' locks. A job now in the dead
    letters failed (an expiry, a dead worker's last attempt); one that is
    nowhere was cancelled.
    """
    ids = [row["id"] for row in rows]
    dead = dict(
        DeadJob.objects.using(store.using).filter(id__in=ids).values_list("id", "last_error")
    )
    workflows = {w.id: w for w in lock(store.using, [row["workflow_id"] for row in rows])}
    for row in rows:
        workflow = workflows.get(row["workflow_id"])
        if workflow is None:
            continue
        if row["id"] in dead:
            state, error = StepState.FAILED, dead[row["id"]] or "dead-lettered"
        else:
            state, error = StepState.CANCELLED, "cancelled: its job was cancelled"
        finish_step(store, workflow, row["step"], row["id"], state, error=error)


def settle_orphans(store: Store) -> int:
    """Finish the steps of running workflows whose job has left by another path; return how many.

    The outcome transaction finishes a step with its job. A job that left
    otherwise (the claim's own move of an exhausted lapsed claim, an expiry
    sweep, an operator's delete) is found here, by the workers' upkeep.
    """
    using = store.using
    live = Job.objects.using(using).filter(id=OuterRef("job_id"))
    orphans = list(
        WorkflowStep.objects.using(using)
        .filter(state=StepState.PENDING, workflow__state=WorkflowState.RUNNING)
        .filter(~Exists(live))
        .values("job_id", "workflow_id", "name")[:1000]
    )
    if not orphans:
        return 0
    rows: list[dict[str, Any]] = [
        {"id": o["job_id"], "workflow_id": o["workflow_id"], "step": o["name"]} for o in orphans
    ]
    with store.dialect.atomic_write():
        lock(using, [row["workflow_id"] for row in rows])
        # Under the locks, only those still orphaned: an ack may have finished one since.
        still = set(
            Job.objects.using(using)
            .filter(id__in=[r["id"] for r in rows])
            .values_list("id", flat=True)
        )
        jobs_gone(store, [row for row in rows if row["id"] not in still])
    return len(rows) - len(still)


def resume(store: Store, job_ids: Sequence[int]) -> None:
    """Let the failed steps of requeued dead letters ``job_ids`` run again, and what waited on them.

    Called in the requeue's transaction, once the jobs are live again. Each
    step goes back to pending; its dependants cancelled because of it wait
    again (unless another parent still failed). A clean-up step that already
    ran is left as it ended. The workflow is running again.
    """
    using = store.using
    failed = list(
        WorkflowStep.objects.using(using)
        .filter(job_id__in=job_ids, state=StepState.FAILED)
        .exclude(workflow__state=WorkflowState.CANCELLED)
        .values_list("workflow_id", "name")
    )
    by_workflow: dict[int, list[str]] = defaultdict(list)
    for workflow_id, name in failed:
        by_workflow[workflow_id].append(name)
    for workflow in lock(using, by_workflow):
        _resume(store, workflow, by_workflow[workflow.id])


def _resume(store: Store, workflow: Workflow, names: list[str]) -> None:
    """Reopen ``names`` and recount every step below them, parents first."""
    query = WorkflowStep.objects.using(store.using).select_for_update()
    steps = {s.name: s for s in query.filter(workflow=workflow).order_by("id")}
    opened = 0
    below: set[str] = set()
    changed: list[WorkflowStep] = []
    for name in names:
        step = steps[name]
        step.state, step.error, step.finished_at = StepState.PENDING, None, None
        opened += 1
        below.update(step.dependants)
        changed.append(step)
    to_release: list[WorkflowStep] = []
    for name in _parents_first(steps):
        step = steps[name]
        if name not in below:
            continue
        below.update(step.dependants)
        upstream_cancel = step.state == StepState.CANCELLED and (step.error or "").startswith(
            UPSTREAM_PREFIX
        )
        if step.state != StepState.WAITING and not upstream_cancel:
            continue
        changed.append(step)
        parents = [steps[p] for p in step.after]
        step.blocked_by = sum(p.state not in FINISHED for p in parents)
        step.upstream_failed = any(
            p.state in (StepState.FAILED, StepState.CANCELLED) for p in parents
        )
        if step.upstream_failed and not step.run_on_upstream_failure:
            continue
        if upstream_cancel:
            step.state, step.error, step.finished_at = StepState.WAITING, None, None
            opened += 1
        if step.blocked_by == 0:
            step.state = StepState.PENDING
            to_release.append(step)
    if to_release:
        release(store, workflow.id, to_release, workflow.trace_context)
    _save(store.using, changed, to_release)
    workflow.steps_open += opened
    workflow.state, workflow.finished_at = WorkflowState.RUNNING, None
    workflow.save(update_fields=["steps_open", "state", "finished_at"])


def _parents_first(steps: dict[str, WorkflowStep]) -> list[str]:
    """Return the step names with every step after all of its parents."""
    blocked = {name: len(step.after) for name, step in steps.items()}
    ready = [name for name, count in blocked.items() if count == 0]
    order: list[str] = []
    while ready:
        name = ready.pop()
        order.append(name)
        for child in steps[name].dependants:
            blocked[child] -= 1
            if blocked[child] == 0:
                ready.append(child)
    return order


@contextmanager
def cancelling(store: Store, ids: Sequence[int]) -> Iterator[None]:
    """Wrap a delete of the live jobs ``ids``: their steps and kept results end with them.

    One transaction (joining the caller's). The jobs' workflows are locked
    before the delete, in the one lock order; afterwards each job the delete
    took ends its step (cancelled, and what depends on it) and writes its
    ``cancelled`` result when it keeps one. A plain job costs one read.
    """
    using = store.using
    with store.dialect.atomic_write():
        rows: list[dict[str, Any]] = [
            dict(row)
            for row in Job.objects.using(using)
            .filter(id__in=ids)
            .filter(Q(workflow_id__isnull=False) | Q(keep_result_s__isnull=False))
            .values("id", "queue", "workflow_id", "step", "keep_result_s", "attempts", "tags")
        ]
        lock(using, [row["workflow_id"] for row in rows if row["workflow_id"] is not None])
        yield
        if not rows:
            return
        still = set(
            Job.objects.using(using)
            .filter(id__in=[r["id"] for r in rows])
            .values_list("id", flat=True)
        )
        gone = [row for row in rows if row["id"] not in still]
        jobs_gone(store, [row for row in gone if row["workflow_id"] is not None])
        for row in gone:
            if row["keep_result_s"] is not None:
                results.keep_row(
                    store,
                    row["id"],
                    row["queue"],
                    row["attempts"],
                    row["keep_result_s"],
                    ResultState.CANCELLED,
                    error="cancelled",
                    tags=row["tags"],
                )


def prune_finished(store: Store) -> int:
    """Delete workflows finished more than ``WORKFLOW_RETENTION_S`` ago, with their steps.

    In batches (``Dialect.in_batches``): each takes ``PRUNE_BATCH_SIZE``
    workflow ids, oldest finish first on ``alk_workflow_finished``, and
    deletes their steps (``alk_step_name`` leads with the workflow) and then
    them in one short transaction. Returns how many workflows went.
    """
    dialect, using = store.dialect, store.using
    cutoff = dialect.database_now() - timedelta(seconds=app_settings.workflow_retention_s)

    def batch(limit: int) -> int:
        old = Workflow.objects.using(using).filter(finished_at__lte=cutoff)
        ids = list(old.order_by("finished_at").values_list("id", flat=True)[:limit])
        if ids:
            WorkflowStep.objects.using(using).filter(workflow_id__in=ids).delete()
            Workflow.objects.using(using).filter(id__in=ids).delete()
        return len(ids)

    return dialect.in_batches(batch)
