"""The workflow builder's checks: every error names the value, and a bad workflow writes nothing.

The builder tests touch no database (pytest-django refuses them one); the
last ones enqueue invalid workflows and count the rows left behind.
"""

from __future__ import annotations

import itertools
import re

import pytest

from alkstore_django import Workflow, store
from alkstore_django.errors import (
    InvalidArgument,
    InvalidName,
    InvalidWorkflow,
    PayloadError,
    ReservedName,
)
from alkstore_django.models import Job, WorkflowStep
from alkstore_django.models import Workflow as WorkflowRow


def graph(edges: dict[str, list[str]]) -> Workflow:
    """Return a workflow of one step per key, each ``after`` its list, all on queue "q"."""
    wf = Workflow()
    for name, after in edges.items():
        wf.add(name, queue="q", after=after)
    return wf


# --- add(): each step checked as it is added --------------------------------------


def test_add__returns_the_workflow_and_keeps_the_steps_in_order():
    wf = Workflow("w")
    assert wf.add("a", queue="q").add("b", queue="q", after=["a"], priority=3) is wf
    assert list(wf.steps) == ["a", "b"]
    assert wf.steps["b"].after == ("a",)
    assert wf.steps["b"].options == {"priority": 3}
    assert wf.steps["b"].on_upstream_failure == "cancel"


def test_add__a_duplicate_step_name_is_refused_by_name():
    wf = Workflow().add("resize", queue="q")
    with pytest.raises(InvalidWorkflow, match=r"^Duplicate step name 'resize': "):
        wf.add("resize", queue="other")
    assert wf.steps["resize"].queue == "q"  # the first one is kept


@pytest.mark.parametrize(
    ("queue", "error", "message"),
    [
        ("", InvalidName, r"^Invalid queue name '': expected a non-empty string\.$"),
        ("bad\x00queue", InvalidName, r"^Invalid queue name 'bad\\x00queue': NUL characters"),
        (42, InvalidName, r"^Invalid queue name 42: expected a non-empty string\.$"),
        ("x" * 201, InvalidName, r"^Invalid queue name 'x{40}'… \(201 characters\)"),
        ("__alkstore_mine", ReservedName, r"^Reserved queue name '__alkstore_mine': "),
    ],
)
def test_add__an_invalid_queue_name_is_refused_by_name(queue, error, message):
    wf = Workflow()
    with pytest.raises(error, match=message):
        wf.add("a", queue=queue)
    assert wf.steps == {}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", r"^Invalid step name '': expected a non-empty string\.$"),
        (None, r"^Invalid step name None: expected a non-empty string\.$"),
        ("a\x00b", r"^Invalid step name 'a\\x00b': NUL characters are not allowed\.$"),
    ],
)
def test_add__an_invalid_step_name_is_refused_by_name(name, message):
    with pytest.raises(InvalidName, match=message):
        Workflow().add(name, queue="q")


def test_add__after_given_as_a_string_is_refused_naming_it():
    with pytest.raises(
        InvalidWorkflow,
        match=r"^Invalid after 'extract' for step 'resize': expected a list of step names\.$",
    ):
        Workflow().add("resize", queue="q", after="extract")


@pytest.mark.parametrize("after", [[1], ["a", None], [b"a"]])
def test_add__after_holding_something_not_a_name_is_refused_naming_it(after):
    expected = re.escape(f"Invalid after {tuple(after)!r} for step 'b': expected step names")
    with pytest.raises(InvalidWorkflow, match=f"^{expected}"):
        Workflow().add("a", queue="q").add("b", queue="q", after=after)


def test_add__after_that_is_not_a_list_at_all_is_refused_naming_it():
    with pytest.raises(InvalidWorkflow, match=r"^Invalid after 7 for step 'b': expected a list"):
        Workflow().add("b", queue="q", after=7)


def test_add__a_step_after_itself_is_refused_by_name():
    with pytest.raises(InvalidWorkflow, match=r"^Step 'loop' cannot run after itself\.$"):
        Workflow().add("loop", queue="q", after=["loop"])


def test_add__a_step_listed_twice_in_after_is_refused_naming_the_list():
    wf = Workflow().add("a", queue="q")
    with pytest.raises(
        InvalidWorkflow, match=r"^Step 'b' lists a step twice in after: \('a', 'a'\)\.$"
    ):
        wf.add("b", queue="q", after=["a", "a"])


@pytest.mark.parametrize("policy", ["skip", "", None, "RUN"])
def test_add__a_bad_on_upstream_failure_is_refused_naming_it(policy):
    expected = re.escape(
        f"Invalid on_upstream_failure {policy!r} for step 'a': expected 'cancel' or 'run'."
    )
    with pytest.raises(InvalidWorkflow, match=f"^{expected}$"):
        Workflow().add("a", queue="q", on_upstream_failure=policy)


def test_add__on_upstream_failure_run_is_kept():
    wf = (
        Workflow()
        .add("a", queue="q")
        .add("clean", queue="q", after=["a"], on_upstream_failure="run")
    )
    assert wf.steps["clean"].on_upstream_failure == "run"


def test_add__an_unknown_option_is_refused_naming_it_and_the_allowed_ones():
    with pytest.raises(
        InvalidWorkflow,
        match=r"^Unknown step option 'retries' for step 'a': expected one of delay_s, "
        r"expires_s, max_attempts, priority, timeout_s\.$",
    ):
        Workflow().add("a", queue="q", retries=3)


def test_add__enqueue_only_options_are_not_step_options():
    # A step's job is enqueued by the workflow: its unique key and result keeping are not its own.
    for option in ("unique_key", "run_at", "keep_result_s"):
        with pytest.raises(InvalidWorkflow, match=f"^Unknown step option '{option}' for step 'a'"):
            Workflow().add("a", queue="q", **{option: 1})


@pytest.mark.parametrize("name", [None, 7, "x" * 201])
def test_workflow__a_bad_workflow_name_is_refused_naming_it(name):
    expected = re.escape(f"Invalid workflow name {name!r}: expected a string of at most 200")
    with pytest.raises(InvalidWorkflow, match=f"^{expected}"):
        Workflow(name)


def test_invalid_workflow__is_an_invalid_argument():
    assert issubclass(InvalidWorkflow, InvalidArgument)


# --- check(): the graph as a whole ---------------------------------------------------


def test_check__an_empty_workflow_is_refused():
    with pytest.raises(InvalidWorkflow, match=r"^Empty workflow: add at least one step "):
        Workflow("nothing").check()


def test_check__an_unknown_step_in_after_is_refused_by_name():
    wf = graph({"extract": [], "resize": ["extract", "extrakt"]})
    with pytest.raises(
        InvalidWorkflow,
        match=r"^Step 'resize' is after unknown step 'extrakt': add 'extrakt' or remove it "
        r"from after\.$",
    ):
        wf.check()


def test_check__a_two_step_cycle_is_named_with_its_arrows():
    with pytest.raises(InvalidWorkflow, match=r"^Workflow has a cycle: b → a → b\.$"):
        graph({"a": ["b"], "b": ["a"]}).check()


def test_check__a_three_step_cycle_is_named_without_the_steps_around_it():
    # a → b → c → a; root feeds the loop and tail hangs off it: neither is in the cycle.
    wf = graph({"root": [], "a": ["root", "c"], "b": ["a"], "c": ["b"], "tail": ["c"]})
    with pytest.raises(InvalidWorkflow, match=r"^Workflow has a cycle: b → c → a → b\.$"):
        wf.check()


def test_check__each_arrow_of_a_named_cycle_points_from_a_step_to_one_after_it():
    wf = graph({"x": ["y"], "y": ["z"], "z": ["x"]})
    with pytest.raises(InvalidWorkflow) as caught:
        wf.check()
    names = str(caught.value).removeprefix("Workflow has a cycle: ").removesuffix(".").split(" → ")
    assert names[0] == names[-1] and sorted(names[:-1]) == ["x", "y", "z"]
    for before, after in itertools.pairwise(names):
        assert before in wf.steps[after].after


def test_check__returns_an_order_where_each_step_follows_its_parents():
    wf = graph({"notify": ["small", "large"], "small": ["extract"], "large": ["extract"],
                "extract": []})  # fmt: skip
    order = wf.check()
    assert sorted(order) == sorted(wf.steps)
    for name in order:
        assert all(order.index(parent) < order.index(name) for parent in wf.steps[name].after)


# --- enqueue_workflow: checked whole, nothing written ------------------------------------


def unknown_after() -> Workflow:
    return graph({"a": [], "b": ["a", "nope"]})


def cycle() -> Workflow:
    return graph({"root": [], "a": ["root", "b"], "b": ["a"]})


def bad_priority() -> Workflow:
    return Workflow().add("a", queue="q").add("b", queue="q", after=["a"], priority="high")


def bad_max_attempts() -> Workflow:
    return Workflow().add("a", queue="q", max_attempts=0)


def payload_not_json() -> Workflow:
    # The bad payload is on the last step: the first one, fine, must not be written either.
    return (
        Workflow()
        .add("a", queue="q", payload={"ok": 1})
        .add("b", queue="q", payload={"ids": {1, 2}}, after=["a"])
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (Workflow, InvalidWorkflow, r"^Empty workflow"),
        (unknown_after, InvalidWorkflow, r"^Step 'b' is after unknown step 'nope'"),
        (cycle, InvalidWorkflow, r"^Workflow has a cycle: b → a → b\.$"),
        (bad_priority, InvalidArgument, r"^Invalid priority 'high': expected an integer"),
        (bad_max_attempts, InvalidArgument, r"^Invalid max_attempts 0: expected an integer"),
        (payload_not_json, PayloadError, r"^Payload .*\{1, 2\}.* cannot be encoded as JSON"),
    ],
    ids=["empty", "unknown-after", "cycle", "priority", "max-attempts", "payload"],
)
def test_enqueue_workflow__an_invalid_workflow_writes_nothing(build, error, message):
    with pytest.raises(error, match=message):
        store.enqueue_workflow(build())
    counts = (WorkflowRow.objects.count(), WorkflowStep.objects.count(), Job.objects.count())
    assert counts == (0, 0, 0)


@pytest.mark.django_db
def test_enqueue_workflow__something_not_a_workflow_is_refused_naming_it():
    with pytest.raises(InvalidWorkflow, match=r"^Invalid workflow \['a'\]: expected an "):
        store.enqueue_workflow(["a"])
    assert (WorkflowRow.objects.count(), Job.objects.count()) == (0, 0)
