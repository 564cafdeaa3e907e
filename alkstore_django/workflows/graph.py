"""The workflow builder: steps and their edges, checked whole before anything is written."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InvalidWorkflow
from ..validation import validate_name

OnUpstreamFailure = Literal["cancel", "run"]
ON_UPSTREAM_FAILURE = ("cancel", "run")
# The per-step enqueue options: a step's job is an ordinary job of its queue.
STEP_OPTIONS = frozenset({"priority", "max_attempts", "timeout_s", "delay_s", "expires_s"})


@dataclass(frozen=True)
class Step:
    """One step as added: its job's queue, payload and options, and what it waits on."""

    name: str
    queue: str
    payload: Any
    after: tuple[str, ...]
    on_upstream_failure: OnUpstreamFailure
    options: dict[str, Any] = field(default_factory=dict)


class Workflow:
    """A graph of steps to enqueue together (``Store.enqueue_workflow``).

    A step runs once every step it is ``after`` has succeeded; one that
    dead-letters cancels what depends on it, unless a dependant was added
    with ``on_upstream_failure="run"`` (a clean-up step, which runs once its
    parents have all finished, however they ended). Nothing touches the
    database until the workflow is enqueued.
    """

    def __init__(self, name: str = "") -> None:
        if not isinstance(name, str) or len(name) > 200:
            raise InvalidWorkflow(
                f"Invalid workflow name {name!r}: expected a string of at most 200 characters."
            )
        self.name = name
        self.steps: dict[str, Step] = {}

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r} steps={len(self.steps)}>"

    def add(
        self,
        name: str,
        *,
        queue: str,
        payload: Any = None,
        after: Iterable[str] = (),
        on_upstream_failure: OnUpstreamFailure = "cancel",
        **options: Any,
    ) -> Workflow:
        """Add step ``name``, its job to run on ``queue`` with ``payload``; return the workflow.

        ``after`` names the steps it waits on (they may be added later).
        ``options`` are the enqueue options a step takes: ``priority``,
        ``max_attempts``, ``timeout_s``, ``delay_s`` (counted from its
        release) and ``expires_s``. Raises ``InvalidWorkflow`` for a
        duplicate name or a bad ``after``, ``InvalidName`` for a bad name.
        """
        validate_name("step", name)
        validate_name("queue", queue)
        if name in self.steps:
            raise InvalidWorkflow(f"Duplicate step name {name!r}: each step needs its own name.")
        if isinstance(after, str | bytes) or not isinstance(after, Iterable):
            raise InvalidWorkflow(
                f"Invalid after {after!r} for step {name!r}: expected a list of step names."
            )
        parents = tuple(after)
        for parent in parents:
            if not isinstance(parent, str):
                raise InvalidWorkflow(
                    f"Invalid after {parents!r} for step {name!r}: expected step names (strings)."
                )
        if len(set(parents)) != len(parents):
            raise InvalidWorkflow(f"Step {name!r} lists a step twice in after: {parents!r}.")
        if name in parents:
            raise InvalidWorkflow(f"Step {name!r} cannot run after itself.")
        if on_upstream_failure not in ON_UPSTREAM_FAILURE:
            raise InvalidWorkflow(
                f"Invalid on_upstream_failure {on_upstream_failure!r} for step {name!r}: "
                "expected 'cancel' or 'run'."
            )
        unknown = sorted(set(options) - STEP_OPTIONS)
        if unknown:
            raise InvalidWorkflow(
                f"Unknown step option {unknown[0]!r} for step {name!r}: expected one of "
                f"{', '.join(sorted(STEP_OPTIONS))}."
            )
        self.steps[name] = Step(name, queue, payload, parents, on_upstream_failure, options)
        return self

    def check(self) -> list[str]:
        """Return the step names in an order where each comes after its parents.

        Raises ``InvalidWorkflow`` for an empty workflow, a step ``after`` one
        that was never added, or a cycle (named, step by step).
        """
        if not self.steps:
            raise InvalidWorkflow("Empty workflow: add at least one step before enqueueing it.")
        for step in self.steps.values():
            for parent in step.after:
                if parent not in self.steps:
                    raise InvalidWorkflow(
                        f"Step {step.name!r} is after unknown step {parent!r}: add {parent!r} "
                        "or remove it from after."
                    )
        blocked = {name: len(step.after) for name, step in self.steps.items()}
        ready = deque(name for name, count in blocked.items() if count == 0)
        dependants = self.dependants()
        order: list[str] = []
        # First in, first out: siblings keep the order they were added in.
        while ready:
            name = ready.popleft()
            order.append(name)
            for child in dependants[name]:
                blocked[child] -= 1
                if blocked[child] == 0:
                    ready.append(child)
        if len(order) != len(self.steps):
            raise InvalidWorkflow(f"Workflow has a cycle: {' → '.join(self._cycle(blocked))}.")
        return order

    def dependants(self) -> dict[str, list[str]]:
        """Return each step's dependants (the steps ``after`` it), in the order they were added."""
        children: dict[str, list[str]] = {name: [] for name in self.steps}
        for step in self.steps.values():
            for parent in step.after:
                children[parent].append(step.name)
        return children

    def _cycle(self, blocked: dict[str, int]) -> list[str]:
        """Walk back through parents still blocked until a step repeats: that loop is a cycle."""
        name = next(name for name, count in blocked.items() if count > 0)
        seen: list[str] = []
        while name not in seen:
            seen.append(name)
            name = next(p for p in self.steps[name].after if blocked[p] > 0)
        loop = seen[seen.index(name) :]
        loop.reverse()
        return [*loop, loop[0]]
