"""``manage.py alkstore``: workflows, workflow ID, cancel-workflow ID and result JOB_ID."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from alkstore_django import Workflow, store
from alkstore_django.models import Job
from alkstore_django.testing import run_ready_jobs
from tests.helpers import manage

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("alkstore", *args, stdout=out)
    return out.getvalue()


def rows_of(text: str) -> dict[str, list[str]]:
    """Return a printed table's rows by their first cell (the header and its rule skipped)."""
    return {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:] if line.strip()}


def table(lines: list[str]) -> list[dict[str, str]]:
    """Return the rows of a table (header, rule, rows) as dicts, cut at the rule's columns."""
    header, rule, *rows = lines
    spans, start = [], 0
    for dashes in rule.split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    names = [header[a:b].strip() for a, b in spans]
    return [{n: row[a:b].strip() for n, (a, b) in zip(names, spans, strict=True)} for row in rows]


def diamond(name: str = "thumbs") -> int:
    wf = Workflow(name)
    wf.add("extract", queue="t.wf", payload={"file": 42})
    wf.add("small", queue="t.wf", payload={"px": 64}, after=["extract"])
    wf.add("large", queue="t.wf", payload={"px": 512}, after=["extract"])
    wf.add("notify", queue="t.wf", after=["small", "large"])
    return store.enqueue_workflow(wf)


def failing_chain() -> int:
    wf = Workflow("breaks")
    wf.add("a", queue="t.wf")
    wf.add("b", queue="t.wf", payload={"fail": True}, after=["a"], max_attempts=1)
    wf.add("c", queue="t.wf", after=["b"])
    return store.enqueue_workflow(wf)


# --- workflows ---------------------------------------------------------------------


def test_workflows__lists_the_newest_first_with_steps_done_of_total():
    first = diamond("first")
    run_ready_jobs(["t.wf"])
    second = diamond()
    failed = failing_chain()
    run_ready_jobs(["t.wf"])  # finishes the second diamond too
    third = diamond("")
    lines = run("workflows").splitlines()
    assert lines[0].split() == ["id", "name", "state", "steps", "done", "created", "finished"]
    assert [int(line.split()[0]) for line in lines[2:]] == [third, failed, second, first]
    rows = rows_of("\n".join(lines))
    assert rows[str(first)][:3] == ["first", "succeeded", "4/4"]
    assert rows[str(failed)][:3] == ["breaks", "failed", "3/3"]
    assert rows[str(third)][:3] == ["-", "running", "0/4"]
    assert rows[str(third)][-1] == "-"  # not finished
    assert rows[str(first)][-1] != "-"


def test_workflows__json_is_a_list_of_objects_without_steps():
    finished = diamond()
    run_ready_jobs(["t.wf"])
    running = diamond("later")
    data = json.loads(run("workflows", "--json"))
    assert [w["id"] for w in data] == [running, finished]
    assert data[0] | {"created_at": None} == {
        "id": running,
        "name": "later",
        "state": "running",
        "created_at": None,
        "finished_at": None,
        "steps_total": 4,
        "steps_open": 4,
        "steps_done": 0,
    }
    assert data[1]["state"] == "succeeded" and data[1]["steps_done"] == 4
    assert data[1]["finished_at"] >= data[1]["created_at"]


def test_workflows__state_and_limit_narrow_the_list():
    failed = failing_chain()
    run_ready_jobs(["t.wf"])
    running = [diamond(), diamond()]
    assert list(rows_of(run("workflows", "--state", "failed"))) == [str(failed)]
    listed = json.loads(run("workflows", "--state", "running", "--json"))
    assert [w["id"] for w in listed] == running[::-1]
    assert [w["id"] for w in json.loads(run("workflows", "--limit", "1", "--json"))] == [running[1]]
    assert run("workflows", "--state", "cancelled") == "No cancelled workflows.\n"


def test_workflows__none_says_so():
    assert run("workflows") == "No workflows.\n"
    assert json.loads(run("workflows", "--json")) == []


def test_workflows__a_bad_state_is_a_command_error_naming_it():
    with pytest.raises(CommandError, match=r"Invalid workflow state 'done': expected one of "):
        run("workflows", "--state", "done")


def test_workflows__a_bad_limit_is_a_usage_error():
    with pytest.raises(CommandError, match="Invalid value '0'"):
        run("workflows", "--limit", "0")


# --- workflow ID -------------------------------------------------------------------


def test_workflow__prints_the_header_then_each_step_in_order():
    workflow_id = failing_chain()
    run_ready_jobs(["t.wf"])
    workflow = store.get_workflow(workflow_id)
    lines = run("workflow", str(workflow_id)).splitlines()
    header = dict(line.split(None, 1) for line in lines[:3])
    assert header == {"id": str(workflow_id), "name": "breaks", "state": "failed"}
    assert lines[3].split() == ["steps", "done", "3", "of", "3"]
    assert lines[4].startswith("created ") and lines[5].startswith("finished ")
    assert "-" not in lines[5].split()
    assert lines[6] == ""
    steps = table(lines[7:])
    assert [(s["step"], s["queue"], s["state"], s["after"]) for s in steps] == [
        ("a", "t.wf", "succeeded", "-"),
        ("b", "t.wf", "failed", "a"),
        ("c", "t.wf", "cancelled", "b"),
    ]
    a, b, c = steps
    assert (a["job"], a["error"]) == (str(workflow.steps["a"].job_id), "-")
    assert json.loads(a["result"]) == workflow.steps["a"].result
    assert (b["job"], b["error"], b["result"]) == (
        str(workflow.steps["b"].job_id),
        "ValueError: step b failed",
        "-",
    )
    assert c["job"] == "-"  # never released: no job
    assert "cancelled" in c["error"]


def test_workflow__cuts_long_results_in_text_and_gives_them_whole_in_json():
    workflow_id = diamond()
    run_ready_jobs(["t.wf"])
    steps = {s["step"]: s for s in table(run("workflow", str(workflow_id)).splitlines()[7:])}
    assert steps["notify"]["result"].endswith("…")
    assert len(steps["notify"]["result"]) == 60
    assert steps["notify"]["after"] == "small, large"
    data = json.loads(run("workflow", str(workflow_id), "--json"))
    assert (data["id"], data["name"], data["state"]) == (workflow_id, "thumbs", "succeeded")
    assert (data["steps_done"], data["steps_total"], data["steps_open"]) == (4, 4, 0)
    names = [s["name"] for s in data["steps"]]
    assert (names[0], names[-1], sorted(names[1:3])) == ("extract", "notify", ["large", "small"])
    steps = {s["name"]: s for s in data["steps"]}
    workflow = store.get_workflow(workflow_id)
    assert steps["notify"]["result"] == workflow.steps["notify"].result
    assert sorted(steps["notify"]["result"]["seen"]) == ["large", "small"]
    assert steps["notify"]["after"] == ["small", "large"]
    assert steps["notify"]["job_id"] == workflow.steps["notify"].job_id
    assert set(steps["notify"]) >= {"queue", "state", "error", "finished_at"}


def test_workflow__a_running_one_shows_what_waits_and_what_is_pending():
    workflow_id = diamond()
    steps = {s["step"]: s for s in table(run("workflow", str(workflow_id)).splitlines()[7:])}
    assert steps["extract"]["state"] == "pending"
    assert steps["extract"]["job"] == str(store.get_workflow(workflow_id).steps["extract"].job_id)
    assert (steps["notify"]["state"], steps["notify"]["job"]) == ("waiting", "-")
    assert steps["notify"]["result"] == "-"


def test_workflow__an_unknown_id_is_a_command_error_with_status_1():
    with pytest.raises(CommandError, match=r"^No workflow 999999\.$") as caught:
        run("workflow", "999999")
    assert caught.value.returncode == 1
    with pytest.raises(CommandError, match=r"^No workflow 999999\.$"):
        run("workflow", "999999", "--json")


# --- cancel-workflow ID ------------------------------------------------------------


def test_cancel_workflow__cancels_once_then_says_it_had_finished():
    workflow_id = diamond()
    assert Job.objects.count() == 1
    out = run("cancel-workflow", str(workflow_id))
    assert f"Cancelled workflow {workflow_id}: its unfinished steps are cancelled" in out
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "cancelled"
    assert {s.state for s in workflow.steps.values()} == {"cancelled"}
    assert Job.objects.count() == 0
    again = run("cancel-workflow", str(workflow_id))
    assert again == f"Workflow {workflow_id} had already finished (cancelled): nothing cancelled.\n"


def test_cancel_workflow__a_succeeded_one_is_left_as_it_is():
    workflow_id = diamond()
    run_ready_jobs(["t.wf"])
    assert "had already finished (succeeded): nothing cancelled." in run(
        "cancel-workflow", str(workflow_id)
    )
    assert store.get_workflow(workflow_id).state == "succeeded"


def test_cancel_workflow__an_unknown_id_is_a_command_error():
    with pytest.raises(CommandError, match=r"^No workflow 999999\.$") as caught:
        run("cancel-workflow", "999999")
    assert caught.value.returncode == 1


# --- result JOB_ID ---------------------------------------------------------------


def test_result__a_kept_success_prints_its_state_and_value():
    job_id = store.queue("t.wf").enqueue({"n": 1}, keep_result_s=3600)
    run_ready_jobs(["t.wf"])
    lines = run("result", str(job_id)).splitlines()
    fields = {line[:11].strip(): line[13:] for line in lines[:6]}
    assert fields | {"finished at": "", "expires at": ""} == {
        "job id": str(job_id),
        "queue": "t.wf",
        "state": "succeeded",
        "attempts": "1",
        "finished at": "",
        "expires at": "",
    }
    assert fields["expires at"] > fields["finished at"] != "-"
    assert lines[6] == "value:"
    value = json.loads("\n".join(lines[7 : lines.index("error:")]))
    assert (value["step"], value["workflow_id"], value["seen"]) == (None, None, {})
    assert lines[lines.index("error:") + 1 :] == [""]
    data = json.loads(run("result", str(job_id), "--json"))
    assert data | {"finished_at": None, "expires_at": None} == {
        "job_id": job_id,
        "queue": "t.wf",
        "state": "succeeded",
        "value": value,
        "error": None,
        "attempts": 1,
        "finished_at": None,
        "expires_at": None,
        "tags": [],
    }
    assert data["expires_at"] > data["finished_at"]


def test_result__a_kept_failure_prints_its_error():
    job_id = store.queue("t.wf").enqueue({"fail": True}, keep_result_s=3600, max_attempts=1)
    run_ready_jobs(["t.wf"])
    out = run("result", str(job_id))
    assert "state        failed" in out
    assert out.split("error:\n", 1)[1].strip().endswith("ValueError: step None failed")
    data = json.loads(run("result", str(job_id), "--json"))
    assert (data["state"], data["value"]) == ("failed", None)
    assert "ValueError: step None failed" in data["error"]


def test_result__not_kept_is_a_command_error_saying_why():
    job_id = store.queue("t.wf").enqueue({"n": 1})
    with pytest.raises(CommandError, match=rf"^No result for job {job_id} yet: it is pending\.$"):
        run("result", str(job_id))
    run_ready_jobs(["t.wf"])
    with pytest.raises(
        CommandError,
        match=rf"^No result for job {job_id}: unknown, expired, or not kept \(enqueue it with "
        r"keep_result_s to keep one\)\.$",
    ) as caught:
        run("result", str(job_id), "--json")
    assert caught.value.returncode == 1


# --- as a process --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_workflow_commands__run_as_a_process_on_the_given_database(subprocess_env):
    workflow_id = diamond()
    listed = manage(subprocess_env, "alkstore", "--database", "default", "workflows", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [w["id"] for w in json.loads(listed.stdout)] == [workflow_id]
    shown = manage(subprocess_env, "alkstore", "workflow", str(workflow_id))
    assert shown.returncode == 0, shown.stderr
    assert "extract" in shown.stdout
    missing = manage(subprocess_env, "alkstore", "workflow", str(workflow_id + 1))
    assert (missing.returncode, missing.stdout) == (1, "")
    assert f"No workflow {workflow_id + 1}." in missing.stderr
    bad = manage(subprocess_env, "alkstore", "workflows", "--state", "done")
    assert bad.returncode == 1
    assert "Invalid workflow state 'done'" in bad.stderr
