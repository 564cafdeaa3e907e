"""A workflow under ``runworker --pool processes``: each step's result comes back from its child."""

from __future__ import annotations

import pytest

from alkstore_django import Workflow, store
from tests.helpers import runworker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_the_process_pool__runs_a_diamond_and_each_step_reads_its_parents_results(
    subprocess_env,
):
    wf = Workflow()
    wf.add("extract", queue="t.wf")
    wf.add("small", queue="t.wf", after=["extract"])
    wf.add("large", queue="t.wf", after=["extract"])
    wf.add("notify", queue="t.wf", after=["small", "large"])
    wf.add("broken", queue="t.wf", payload={"bad_return": True}, max_attempts=1)
    workflow_id = store.enqueue_workflow(wf)
    code, out = runworker(
        subprocess_env, "--queue", "t.wf", "--pool", "processes", "--concurrency", "2", "--burst"
    )
    assert code == 0, out
    workflow = store.get_workflow(workflow_id)
    steps = workflow.steps
    assert [steps[n].state for n in ("extract", "small", "large", "notify")] == ["succeeded"] * 4
    assert steps["notify"].result["seen"] == {
        "small": steps["small"].result,
        "large": steps["large"].result,
    }
    assert steps["small"].result["seen"]["extract"]["step"] == "extract"
    # A value the child cannot send fails the step as the thread pool does.
    assert steps["broken"].state == "failed"
    assert steps["broken"].error.startswith(
        "the ack outcome could not be recorded: PayloadError: Return value"
    )
    assert workflow.state == "failed"
