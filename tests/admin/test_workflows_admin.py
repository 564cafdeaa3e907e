"""The workflows admin: the list, a workflow's graph and steps, cancel, and kept results."""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from alkstore_django import Workflow, store
from alkstore_django.admin.workflows import LAYER_CAP, STEPS_PER_PAGE, columns_of, layers_of
from alkstore_django.models import DeadJob, Job, JobResult
from alkstore_django.records import WorkflowStep
from alkstore_django.testing import run_ready_jobs
from tests.helpers import post_action

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:alkstore_django_workflow_changelist"
BOX = re.compile(r'<g class="alk-step alk-step-(\w+)[^"]*" data-step="([^"]*)">')


def changelist_url() -> str:
    return reverse(CHANGELIST)


def detail_url(workflow_id: int) -> str:
    return reverse("admin:alkstore_django_workflow_change", args=[workflow_id])


def failed_diamond() -> int:
    """A diamond whose ``large`` step dead-letters: ``notify`` is cancelled, ``cleanup`` runs."""
    wf = Workflow("resize-upload-42")
    wf.add("extract", queue="t.wf", payload={"file": 42})
    wf.add("small", queue="t.wf", payload={"px": 64}, after=["extract"])
    wf.add("large", queue="t.wf", payload={"px": 512, "fail": True}, after=["extract"],
           max_attempts=1)  # fmt: skip
    wf.add("notify", queue="t.wf", after=["small", "large"])
    wf.add("cleanup", queue="t.wf", after=["notify"], on_upstream_failure="run")
    workflow_id = store.enqueue_workflow(wf)
    run_ready_jobs(["t.wf"])
    return workflow_id


def running_chain(name: str = "nightly-report") -> int:
    """A chain whose first step is pending (a job of its own) and the second waits."""
    wf = Workflow(name)
    wf.add("collect", queue="t.wf")
    wf.add("render", queue="t.wf", after=["collect"])
    return store.enqueue_workflow(wf)


def boxes(html: str) -> dict[str, str]:
    """The graph's step boxes: step name → the state in its class."""
    return {name: state for state, name in BOX.findall(html)}


def step(name: str, after: tuple[str, ...] = ()) -> WorkflowStep:
    return WorkflowStep(name, "q", "waiting", after, None, None, None, None)


# --- the layout -------------------------------------------------------------------


def test_layers_of__is_the_longest_path_from_a_root():
    steps = {s.name: s for s in (step("a"), step("b", ("a",)), step("c", ("a", "b")), step("d"))}
    assert layers_of(steps) == {"a": 0, "b": 1, "c": 2, "d": 0}


def test_columns_of__orders_a_layer_by_its_parents_and_numbers_as_numbers():
    steps = {
        s.name: s
        for s in (
            step("top"),
            step("bottom"),
            step("part-10", ("top",)),
            step("part-2", ("top",)),
            step("under", ("bottom",)),
        )
    }
    assert columns_of(steps) == [["bottom", "top"], ["under", "part-2", "part-10"]]


# --- the list ---------------------------------------------------------------------


def test_changelist__shows_state_steps_done_of_total_and_started(admin_client):
    failed = failed_diamond()
    running = running_chain()
    response = admin_client.get(changelist_url())
    assert response.status_code == 200
    html = response.content.decode()
    assert '<td class="field-steps_done">5 of 5</td>' in html
    assert '<td class="field-steps_done">0 of 2</td>' in html
    assert "resize-upload-42" in html and "nightly-report" in html
    assert 'class="alk-workflow-failed"' in html
    assert [w.id for w in response.context["cl"].result_list] == [running, failed]


def test_changelist__filters_by_state_and_searches_name_and_exact_id(admin_client):
    failed = failed_diamond()
    running = running_chain("weekly-digest")
    response = admin_client.get(changelist_url(), {"state": "failed"})
    assert [w.id for w in response.context["cl"].result_list] == [failed]
    response = admin_client.get(changelist_url(), {"state": "running"})
    assert [w.id for w in response.context["cl"].result_list] == [running]
    response = admin_client.get(changelist_url(), {"q": "digest"})
    assert [w.id for w in response.context["cl"].result_list] == [running]
    response = admin_client.get(changelist_url(), {"q": str(failed)})
    assert [w.id for w in response.context["cl"].result_list] == [failed]


def test_changelist__needs_view_workflow_and_offers_no_add_or_delete(staff_client):
    running_chain()
    assert staff_client().get(changelist_url()).status_code == 403
    viewer = staff_client("view_workflow")
    response = viewer.get(changelist_url())
    assert response.status_code == 200
    assert response.context["action_form"] is None  # neither cancel nor delete
    assert viewer.get(reverse("admin:alkstore_django_workflow_add")).status_code == 403


# --- a workflow's page --------------------------------------------------------------


def test_detail__draws_one_box_per_step_coloured_by_state_with_arrows_for_after(admin_client):
    workflow_id = failed_diamond()
    response = admin_client.get(detail_url(workflow_id))
    assert response.status_code == 200
    html = response.content.decode()
    assert '<svg id="alk-graph"' in html
    assert boxes(html) == {
        "extract": "succeeded",
        "small": "succeeded",
        "large": "failed",
        "notify": "cancelled",
        "cleanup": "succeeded",
    }
    assert html.count('<path class="alk-edge"') == 5
    graph = response.context["graph"]
    assert graph.layers == 4 and graph.hidden == 0
    # The legend counts every state.
    assert dict(response.context["legend"]) == {
        "waiting": 0, "pending": 0, "processing": 0, "succeeded": 3, "failed": 1, "cancelled": 1,
    }  # fmt: skip
    assert "<script" not in html.split('<svg id="alk-graph"')[1].split("</svg>")[0]


def test_detail__a_box_links_to_its_job_dead_letter_or_its_row(admin_client):
    failed = store.get_workflow(failed_diamond())
    running = store.get_workflow(running_chain())
    html = admin_client.get(detail_url(failed.id)).content.decode()
    dead_url = reverse("admin:alkstore_django_deadjob_change", args=[failed.steps["large"].job_id])
    assert f'<a class="alk-box" href="{dead_url}"><g class="alk-step alk-step-failed"' in html
    # No job page for the cancelled step (never released) or the acked ones: their row.
    assert '<a class="alk-box" href="?step=notify#alk-selected-step">' in html
    assert '<a class="alk-box" href="?step=extract#alk-selected-step">' in html
    html = admin_client.get(detail_url(running.id)).content.decode()
    job_url = reverse("admin:alkstore_django_job_change", args=[running.steps["collect"].job_id])
    assert f'<a class="alk-box" href="{job_url}"><g class="alk-step alk-step-pending"' in html
    assert 'data-step="render"' in html and "alk-step-waiting" in html


def test_detail__the_steps_table_shows_after_job_result_error_and_finished(admin_client):
    workflow = store.get_workflow(failed_diamond())
    response = admin_client.get(detail_url(workflow.id))
    rows = {row.step.name: row for row in response.context["step_rows"]}
    assert [name for name in rows] == ["extract", "large", "small", "notify", "cleanup"]
    assert rows["notify"].after == "small, large"
    assert rows["large"].job == f"dead letter {workflow.steps['large'].job_id}"
    assert rows["large"].error == "ValueError: step large failed"
    assert rows["notify"].error == "cancelled: upstream step 'large' failed"
    assert rows["extract"].job == f"job {workflow.steps['extract'].job_id} (acked)"
    assert '"step": "extract"' in rows["extract"].result
    assert rows["extract"].finished_at != "-"
    html = response.content.decode()
    assert "(clean-up)" in html
    assert "ValueError: step large failed" in html


def test_detail__a_chosen_step_is_outlined_and_its_row_marked(admin_client):
    workflow_id = failed_diamond()
    html = admin_client.get(detail_url(workflow_id), {"step": "large"}).content.decode()
    assert '<g class="alk-step alk-step-failed alk-selected" data-step="large">' in html
    assert '<tr data-step="large" id="alk-selected-step" class="alk-selected">' in html


def test_detail__escapes_step_names_and_results(admin_client):
    wf = Workflow("<b>wf</b>")
    wf.add("<i>x</i>", queue="t.wf")
    workflow_id = store.enqueue_workflow(wf)
    run_ready_jobs(["t.wf"])
    html = admin_client.get(detail_url(workflow_id)).content.decode()
    assert "<i>x</i>" not in html and "<b>wf</b>" not in html
    assert 'data-step="&lt;i&gt;x&lt;/i&gt;"' in html


def test_detail__a_long_step_name_is_cut_in_its_box_and_whole_in_its_title(admin_client):
    name = "extract-every-attachment-of-the-quarterly-report"
    wf = Workflow()
    wf.add(name, queue="t.wf")
    html = admin_client.get(detail_url(store.enqueue_workflow(wf))).content.decode()
    assert '<text class="alk-name" x="16" y="26">extract-every-attachm…</text>' in html
    assert f"<title>{name} · queue t.wf · pending · job " in html


def test_detail__a_1000_step_fan_out_draws_a_capped_layer_and_pages_the_table(
    admin_client, django_assert_max_num_queries
):
    wf = Workflow("fan-out")
    wf.add("split", queue="t.wf")
    for n in range(1000):
        wf.add(f"part-{n}", queue="t.wf", after=["split"])
    wf.add("join", queue="t.wf", after=[f"part-{n}" for n in range(1000)])
    workflow_id = store.enqueue_workflow(wf)
    started = time.monotonic()
    with django_assert_max_num_queries(25):  # no query per step
        response = admin_client.get(detail_url(workflow_id))
    assert time.monotonic() - started < 5
    html = response.content.decode()
    drawn = boxes(html)
    assert len(drawn) == 1 + LAYER_CAP + 1
    assert {"split", "part-0", f"part-{LAYER_CAP - 1}", "join"} <= set(drawn)
    assert f"part-{LAYER_CAP}" not in drawn
    assert f"+{1000 - LAYER_CAP} more" in html
    assert "alk-step-more" in html
    # One arrow per pair of drawn boxes: split → each part and the more box, and back to join.
    assert html.count('<path class="alk-edge"') == 2 * (LAYER_CAP + 1)
    assert len(response.context["step_rows"]) == STEPS_PER_PAGE
    rows = {row.step.name: row for row in response.context["step_rows"]}
    assert rows["split"].job.startswith("live job ")
    assert rows["part-1"].after == "split"
    join = admin_client.get(detail_url(workflow_id), {"step": "join"}).context
    assert join["steps_page"].number == 6
    assert [row.step.name for row in join["step_rows"]][-1] == "join"
    assert join["step_rows"][-1].after == "part-0, part-1, part-2, part-3, part-4 and 995 more"


def test_detail__needs_view_workflow(staff_client):
    workflow_id = running_chain()
    assert staff_client().get(detail_url(workflow_id)).status_code == 403
    response = staff_client("view_workflow").get(detail_url(workflow_id))
    assert response.status_code == 200
    # Without view_job a step's job is named, not linked (its page would be a 403).
    assert "/admin/alkstore_django/job/" not in response.content.decode()


# --- cancel -------------------------------------------------------------------------


def test_cancel_action__cancels_running_workflows_and_counts_the_ended(admin_client):
    failed = failed_diamond()
    running = running_chain()
    pending_job = store.get_workflow(running).steps["collect"].job_id
    response = post_action(admin_client, changelist_url(), "cancel", [running, failed])
    assert response.status_code == 302
    message = [str(m) for m in get_messages(response.wsgi_request)]
    assert message == ["Cancelled 1 workflow(s). 1 had already ended: nothing to cancel."]
    workflow = store.get_workflow(running)
    assert workflow.state == "cancelled"
    assert {s.state for s in workflow.steps.values()} == {"cancelled"}
    assert not Job.objects.filter(id=pending_job).exists()
    assert store.get_workflow(failed).state == "failed"
    entries = LogEntry.objects.filter(content_type__model="workflow")
    assert [(e.object_id, e.action_flag) for e in entries] == [(str(running), CHANGE)]


def test_cancel_action__needs_change_workflow(staff_client):
    running = running_chain()
    viewer = staff_client("view_workflow")
    assert viewer.get(changelist_url()).context["action_form"] is None
    post_action(viewer, changelist_url(), "cancel", [running])
    assert store.get_workflow(running).state == "running"
    canceller = staff_client("view_workflow", "change_workflow")
    response = canceller.get(changelist_url())
    choices = [name for name, _ in response.context["action_form"].fields["action"].choices]
    assert choices[1:] == ["cancel"]
    post_action(canceller, changelist_url(), "cancel", [running])
    assert store.get_workflow(running).state == "cancelled"


# --- jobs' pages and kept results -----------------------------------------------------


def test_dead_letter_page__shows_the_kept_result_and_links_back_to_its_step(admin_client):
    job_id = store.queue("t.raise").enqueue({"n": 1}, max_attempts=1, keep_result_s=3600)
    run_ready_jobs(["t.raise"])
    html = admin_client.get(
        reverse("admin:alkstore_django_deadjob_change", args=[job_id])
    ).content.decode()
    assert "Kept result:" in html
    result_url = reverse("admin:alkstore_django_jobresult_change", args=[job_id])
    assert f'<a href="{result_url}">failed at ' in html
    assert "kept until" in html and "ValueError: boom {&#x27;n&#x27;: 1}" in html

    workflow_id = failed_diamond()
    dead = DeadJob.objects.get(workflow_id=workflow_id, step="large")
    html = admin_client.get(
        reverse("admin:alkstore_django_deadjob_change", args=[dead.id])
    ).content.decode()
    step_url = f"{detail_url(workflow_id)}?step=large#alk-selected-step"
    assert f'<a href="{step_url}">step &#x27;large&#x27; of workflow {workflow_id}</a>' in html
    assert "not kept (enqueued without keep_result_s)" in html


def test_live_job_page__says_how_long_its_result_is_kept_and_links_its_workflow(admin_client):
    job_id = store.queue("t.record").enqueue({"n": 1}, keep_result_s=3600)
    html = admin_client.get(reverse("admin:alkstore_django_job_change", args=[job_id])).content
    assert "keeps its result for 3600 s once it has finished" in html.decode()
    workflow_id = running_chain()
    job_id = store.get_workflow(workflow_id).steps["collect"].job_id
    html = admin_client.get(reverse("admin:alkstore_django_job_change", args=[job_id])).content
    step_url = f"{detail_url(workflow_id)}?step=collect#alk-selected-step"
    assert f'<a href="{step_url}">' in html.decode()
    assert "not kept (enqueued without keep_result_s)" in html.decode()


def test_result_admin__lists_kept_results_filtered_by_state_and_queue(admin_client):
    done = store.queue("t.record").enqueue({"n": 1}, keep_result_s=3600)
    dead = store.queue("t.raise").enqueue({"n": 2}, max_attempts=1, keep_result_s=3600)
    store.queue("t.record").enqueue({"n": 3})  # not kept
    run_ready_jobs(["t.record", "t.raise"])
    url = reverse("admin:alkstore_django_jobresult_changelist")

    def listed(**params: str) -> list[int]:
        response = admin_client.get(url, params)
        return [r.job_id for r in response.context["cl"].result_list]

    assert listed() == [dead, done]
    assert listed(state="failed") == [dead]
    assert listed(queue="t.record") == [done]
    assert listed(q=str(done)) == [done]
    html = admin_client.get(reverse("admin:alkstore_django_jobresult_change", args=[done])).content
    assert f"&quot;ok&quot;: {done}" in html.decode()
    assert "gone (acked, cancelled, or dead letter deleted)" in html.decode()
    assert JobResult.objects.count() == 2


def test_result_admin__needs_view_jobresult_and_is_read_only(staff_client):
    job_id = store.queue("t.record").enqueue({"n": 1}, keep_result_s=3600)
    run_ready_jobs(["t.record"])
    url = reverse("admin:alkstore_django_jobresult_changelist")
    assert staff_client().get(url).status_code == 403
    viewer = staff_client("view_jobresult")
    response = viewer.get(url)
    assert response.status_code == 200
    assert response.context["action_form"] is None  # no delete: results expire
    change = reverse("admin:alkstore_django_jobresult_change", args=[job_id])
    response = viewer.post(change, {})
    assert response.status_code == 403
