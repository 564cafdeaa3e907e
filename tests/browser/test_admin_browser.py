"""End to end in a real browser: log in, read the overview, requeue a dead letter, see it run.

Also: delete dead letters through the confirmation page, watch the worker on the
live-workers page, pause a queue and a schedule, and the task-results list fits a 1400 px
window; follow a failed workflow's graph; watch a running import's progress and cancel it.

Debian's ``chromium`` is driven by Playwright for Python (Playwright cannot
download its own browser here). The test is skipped, with the reason, only
when Playwright cannot be imported or the browser cannot be started.
Screenshots go to a temporary folder; with ``ALKSTORE_SCREENSHOTS=1`` they are
written to ``docs/img/`` for ``docs/operations.md``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from alkstore_django import store
from alkstore_django.models import DeadJob, Job, OutcomeMinute, Schedule, TaskResult, TaskStatus
from tests.factories import DeadJobFactory, LockFactory, ScheduleFactory
from tests.helpers import lapse_claim
from tests.testapp.models import Run

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
QUEUE = "t.record"
PASSWORD = "correct horse battery staple"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "shop/jobs.py", line 42, in send_receipt\n'
    "    smtp.send(message)\n"
    "TimeoutError: SMTP server smtp.example.com did not answer in 30 s"
)


@pytest.fixture
def screenshots(tmp_path) -> Path:
    if os.environ.get("ALKSTORE_SCREENSHOTS"):
        return ROOT / "docs" / "img"
    return tmp_path


@contextmanager
def chromium() -> Iterator[Any]:
    """Yield a headless Chromium context with an empty profile, or skip saying why.

    Playwright's sync API runs an event loop in this thread while it is open, so
    the test touches the ORM only before and after (Django refuses sync ORM
    calls under a running loop).
    """
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        pytest.skip(f"Playwright for Python is not installed ({exc}): pip install playwright")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        try:
            context = pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1440, "height": 860},
            )
        except Error as exc:
            pytest.skip(f"Chromium at {CHROMIUM} could not be started: {exc}")
        try:
            yield context
        finally:
            context.close()


def log_in(page: Any, base: str) -> None:
    """Log the superuser ``operator`` in through the admin's login form."""
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")


def populate() -> int:
    """Fill the tables like a site with some trouble; return the dead letter to requeue."""
    now = timezone.now()
    emails = store.queue("emails")
    emails.enqueue_many([{"to": f"user{i}@example.com"} for i in range(7)])
    emails.enqueue_many([{"digest": i} for i in range(3)], delay_s=3600)
    store.queue("thumbnails").enqueue_many([{"image": i} for i in range(4)])
    reports = store.queue("reports")
    reports.enqueue_many([{"report": i} for i in range(3)])
    stuck = reports.claim_one("web-2:3117:a1f0")
    reports.claim_one("web-1:2240:9c3e")
    lapse_claim(stuck.job.id, seconds_ago=240)
    for minute in range(1, 60):
        OutcomeMinute.objects.create(
            queue="emails",
            minute=(now - timedelta(minutes=minute)).replace(second=0, microsecond=0),
            acked=20 + (minute * 7) % 23,
        )
    for i in range(12):
        DeadJobFactory(
            queue="emails",
            payload={"to": f"user{i}@example.com", "template": "receipt"},
            last_error=TRACEBACK,
            died_at=now - timedelta(minutes=i * 5 + 1),
        )
    DeadJobFactory(
        queue="emails",
        payload={"to": "mallory@example.com", "html": "<script>alert('hi')</script>"},
        last_error="ValueError: template rendered <b>unsafe</b> markup",
    )
    ScheduleFactory(name="nightly-digest", spec="@every 1d", interval_s=86_400, queue="emails")
    ScheduleFactory(name="cleanup", spec="@every 15m", interval_s=900, queue="maintenance")
    store.schedule(
        "weekday-report", "@cron 0 9 * * mon-fri", "reports", zone="Europe/Paris", misfire="latest"
    )
    LockFactory(name="__alkstore_scheduler", owner="web-1:4242:9f2c", fence=3)
    LockFactory(name="report-export", expires_at=now - timedelta(minutes=3))
    statuses = [TaskStatus.SUCCESSFUL, TaskStatus.FAILED, TaskStatus.READY]
    for i in range(12):
        status = statuses[i % 3]
        TaskResult.objects.create(
            id=20_000 + i,
            backend="default",
            queue="emails-transactional",
            task_path=f"shop.notifications.tasks.send_order_confirmation_receipt_{i}",
            status=status,
            enqueued_at=now - timedelta(minutes=i),
            finished_at=None if status == TaskStatus.READY else now - timedelta(minutes=i) / 2,
        )
    target = DeadJobFactory(
        queue=QUEUE, payload={"order": 1042}, last_error="ConnectionError: payment API down"
    )
    return target.id


@pytest.mark.django_db(transaction=True)
def test_operator_requeues_a_dead_letter_and_a_worker_runs_it(
    live_server, screenshots, python, subprocess_env
):
    dead_id = populate()
    User.objects.create_superuser("operator", "ops@example.com", PASSWORD)
    with chromium() as browser:
        drive(browser, live_server.url, dead_id, screenshots, [python], subprocess_env)
    run = Run.objects.get(job_id=dead_id)
    assert (run.queue, run.attempt) == (QUEUE, 1)
    assert not Job.objects.filter(id=dead_id).exists()
    assert DeadJob.objects.filter(queue="emails").count() == 13 - 2  # two deleted
    assert not Schedule.objects.get(name="nightly-digest").enabled
    assert store.queue("thumbnails").is_paused()
    assert not store.queue("emails").is_paused()
    assert Schedule.objects.get(name="cleanup").enabled


def drive(
    browser: Any, base: str, dead_id: int, screenshots: Path, python: list[str], env: dict
) -> None:
    """The operator's path through the admin; a worker process runs in the middle."""
    page = browser.new_page()

    log_in(page, base)
    assert page.locator('a[href$="/alkstore_django/queueoverview/"]').first.is_visible()
    page.screenshot(path=str(screenshots / "admin-index.png"))

    page.goto(f"{base}/admin/alkstore_django/")
    page.screenshot(path=str(screenshots / "app-index.png"))

    page.click("#content-main >> text=Queue overview")
    page.wait_for_selector("#alk-queues")
    page.click("#toggle-nav-sidebar")  # more room for the tables in the screenshots
    row = page.locator(f'tr[data-queue="{QUEUE}"] td')
    assert row.nth(4).inner_text() == "1"  # one dead letter
    assert page.locator("#alk-chart rect.acked").count() > 0
    page.screenshot(path=str(screenshots / "overview.png"), full_page=True)

    # Pausing a queue from its overview row: the message, and the row says so.
    page.locator('tr[data-queue="thumbnails"] form.alk-control button').click()
    page.wait_for_selector("ul.messagelist")
    assert "Queue 'thumbnails': Paused" in page.locator("ul.messagelist").inner_text()
    assert page.locator('tr[data-queue="thumbnails"] .alk-paused').is_visible()
    assert page.locator(f'tr[data-queue="{QUEUE}"] .alk-paused').count() == 0
    page.locator("#alk-queues").screenshot(path=str(screenshots / "overview-paused.png"))

    page.goto(f"{base}/admin/alkstore_django/deadjob/?queue=emails")
    page.screenshot(path=str(screenshots / "dead-letters.png"))
    page.goto(f"{base}/admin/alkstore_django/deadjob/?q=unsafe")
    page.locator("#result_list tbody a").first.click()
    page.wait_for_selector("pre")
    assert "<script>alert('hi')</script>" in page.locator("pre").last.inner_text()
    assert page.locator("script:has-text('alert')").count() == 0  # shown, never run
    page.screenshot(path=str(screenshots / "dead-letter-detail.png"), full_page=True)

    # Two dead letters deleted through Django's confirmation page.
    page.goto(f"{base}/admin/alkstore_django/deadjob/?queue=emails")
    page.locator('input[name="_selected_action"]').nth(0).check()
    page.locator('input[name="_selected_action"]').nth(1).check()
    page.select_option("select[name=action]", "delete_selected")
    page.click("button[name=index]")
    page.wait_for_selector("form input[name=post]", state="attached")
    assert "Are you sure you want to delete" in page.locator("#content").inner_text()
    page.screenshot(path=str(screenshots / "delete-confirmation.png"))
    page.click("input[type=submit]")
    page.wait_for_selector("ul.messagelist")
    assert "Successfully deleted 2 dead letters." in page.locator("ul.messagelist").inner_text()

    # The detail page's Requeue button: the job goes back under its id, and the page follows it.
    page.goto(f"{base}/admin/alkstore_django/deadjob/{dead_id}/change/")
    page.screenshot(path=str(screenshots / "dead-letter-requeue-button.png"))
    page.click("form.alk-requeue button")
    page.wait_for_url(f"**/admin/alkstore_django/job/{dead_id}/change/")
    assert f"Requeued dead letter {dead_id}" in page.locator("ul.messagelist").inner_text()
    page.screenshot(path=str(screenshots / "requeued.png"))

    page.goto(f"{base}/admin/alkstore_django/job/")
    page.screenshot(path=str(screenshots / "live-jobs.png"))

    # A worker runs the requeued job and stays up: the overview counts it as a
    # consumer and the live-workers page lists it with what it has done.
    worker = subprocess.Popen(
        [*python, "-m", "django", "runworker", "--queue", QUEUE],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        page.goto(f"{base}/admin/alkstore_django/liveworker/")
        # The default worker id is host:pid:random.
        listed = page.locator("#result_list .field-worker", has_text=f":{worker.pid}:")
        for _ in range(60):
            page.reload()
            jobs = page.locator("#result_list td.field-jobs")
            if listed.count() and jobs.first.inner_text().startswith("1 acked"):
                break
            page.wait_for_timeout(250)
        else:
            raise AssertionError(f"worker {worker.pid} never listed with one job acked")
        assert QUEUE in page.locator("#result_list td.field-queue_names").first.inner_text()
        page.screenshot(path=str(screenshots / "live-workers.png"))

        page.goto(f"{base}/admin/alkstore_django/deadjob/overview/")
        row = page.locator(f'tr[data-queue="{QUEUE}"] td')
        assert [row.nth(i).inner_text() for i in range(5)] == ["0", "0", "0", "0", "0"]
        page.screenshot(path=str(screenshots / "overview-after.png"), full_page=True)
    finally:
        worker.terminate()
        _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr

    # Pausing a schedule: the admin action, its message, and the paused row.
    page.goto(f"{base}/admin/alkstore_django/schedule/")
    page.locator("#result_list tr", has_text="nightly-digest").locator(
        'input[name="_selected_action"]'
    ).check()
    page.select_option("select[name=action]", "disable")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert "Paused 1 schedule(s)." in page.locator("ul.messagelist").inner_text()
    page.screenshot(path=str(screenshots / "schedules.png"))
    page.goto(f"{base}/admin/alkstore_django/lock/")
    page.screenshot(path=str(screenshots / "locks.png"))

    # The task results fit a 1400 px window, nav sidebar open, beside the filters.
    page.set_viewport_size({"width": 1400, "height": 860})
    page.goto(f"{base}/admin/alkstore_django/taskresult/")
    if page.locator("#nav-sidebar").is_hidden():
        page.click("#toggle-nav-sidebar")
    results = page.locator("#changelist .results")
    overflow = results.evaluate("el => el.scrollWidth - el.clientWidth")
    assert overflow <= 0, f"the task-results table is {overflow} px too wide at 1400 px"
    page.screenshot(path=str(screenshots / "task-results.png"))
    page.close()


def populate_workflows() -> int:
    """Workflows in each state; return the diamond whose ``large`` step failed."""
    from alkstore_django import Workflow
    from alkstore_django.testing import run_ready_jobs

    wf = Workflow("resize-upload-42")
    wf.add("extract", queue="t.wf", payload={"file": 42})
    wf.add("small", queue="t.wf", payload={"px": 64}, after=["extract"])
    wf.add("large", queue="t.wf", payload={"px": 512, "fail": True}, after=["extract"],
           max_attempts=1)  # fmt: skip
    wf.add("notify", queue="t.wf", payload={"user": 5}, after=["small", "large"])
    wf.add("cleanup", queue="t.wf", after=["notify"], on_upstream_failure="run")
    diamond = store.enqueue_workflow(wf)
    chain = Workflow("nightly-report")
    chain.add("collect", queue="t.wf")
    chain.add("render", queue="t.wf", after=["collect"])
    chain.add("mail", queue="t.wf", after=["render"])
    store.enqueue_workflow(chain)
    run_ready_jobs(["t.wf"])
    abandoned = Workflow("reindex-catalogue")
    abandoned.add("scan", queue="t.wf", delay_s=3600)
    abandoned.add("index", queue="t.wf", after=["scan"])
    store.cancel_workflow(store.enqueue_workflow(abandoned))
    fan_out = Workflow("thumbnails-for-import-7")
    fan_out.add("split", queue="t.wf", delay_s=3600)
    for n in range(200):
        fan_out.add(f"thumb-{n}", queue="t.wf", after=["split"])
    fan_out.add("publish", queue="t.wf", after=[f"thumb-{n}" for n in range(200)])
    store.enqueue_workflow(fan_out)
    return diamond


@pytest.mark.django_db(transaction=True)
def test_operator_reads_a_failed_workflow_and_follows_its_steps(live_server, screenshots):
    diamond = populate_workflows()
    User.objects.create_superuser("operator", "ops@example.com", PASSWORD)
    dead_step = DeadJob.objects.get(workflow_id=diamond, step="large").id
    base = live_server.url
    with chromium() as browser:
        page = browser.new_page()
        log_in(page, base)

        page.goto(f"{base}/admin/alkstore_django/workflow/")
        assert page.locator("#result_list tbody tr").count() == 4
        row = page.locator("#result_list tbody tr", has_text="resize-upload-42")
        assert row.locator("td.field-steps_done").inner_text() == "5 of 5"
        assert row.locator("td.field-state_mark").inner_text() == "failed"
        page.screenshot(path=str(screenshots / "workflows.png"))

        row.locator("th a").click()
        page.wait_for_selector("#alk-graph")
        boxes = page.locator("#alk-graph g.alk-step")
        assert boxes.count() == 5
        fills = {
            name: page.locator(f'#alk-graph g[data-step="{name}"] rect').evaluate(
                "el => getComputedStyle(el).fill"
            )
            for name in ("extract", "large", "notify")
        }
        assert fills == {
            "extract": "rgb(46, 125, 50)",
            "large": "rgb(186, 33, 33)",
            "notify": "rgb(85, 85, 85)",
        }
        assert page.locator("#alk-graph path.alk-edge").count() == 5
        # The graph fits the content area at 1440 px: no sideways scroll.
        overflow = page.locator(".alk-graph-wrap").evaluate("el => el.scrollWidth - el.clientWidth")
        assert overflow <= 0, f"the graph is {overflow} px too wide"
        page.screenshot(path=str(screenshots / "workflow.png"), full_page=True)

        # The failed step's box leads to its dead letter, which links back to the step.
        page.locator('#alk-graph g[data-step="large"]').click()
        page.wait_for_url(f"**/admin/alkstore_django/deadjob/{dead_step}/change/")
        page.locator(".field-workflow_step a").click()
        page.wait_for_selector("#alk-selected-step")
        assert page.locator("#alk-selected-step th").inner_text() == "large"
        assert page.locator('#alk-graph g.alk-selected[data-step="large"]').count() == 1
        page.close()


@pytest.mark.django_db(transaction=True)
def test_operator_watches_an_import_progress_and_cancels_it_while_it_runs(
    live_server, screenshots, python, subprocess_env
):
    """The live jobs page draws the running job's progress; its Cancel button stops the run."""
    imports = store.queue("c.import")
    job_id = imports.enqueue(
        {"file": "customers-7.csv", "rows": 6_000, "row_s": 0.005},
        concurrency_key="customer:7",
        tags=["customer:7", "import"],
        keep_result_s=3600,
    )
    imports.enqueue_many([{"file": f"customers-8-{i}.csv"} for i in range(2)], tags=["import"])
    User.objects.create_superuser("operator", "ops@example.com", PASSWORD)
    worker = subprocess.Popen(
        [python, "-m", "django", "runworker", "--queue", "c.import", "--concurrency", "1"],
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with chromium() as browser:
            page = browser.new_page()
            base = live_server.url
            log_in(page, base)
            page.goto(f"{base}/admin/alkstore_django/job/")
            page.click("#toggle-nav-sidebar")  # more room for the table in the screenshot
            bar = page.locator(f'#result_list tr:has(a[href$="/job/{job_id}/change/"]) progress')
            for _ in range(80):
                if bar.count() and int(bar.get_attribute("value")) >= 8:
                    break
                page.wait_for_timeout(250)
                page.reload()
            else:
                raise AssertionError("the running job's progress bar never showed 8 %")
            assert "rows imported" in page.locator("#result_list").inner_text()
            page.screenshot(path=str(screenshots / "live-jobs-progress.png"))

            page.goto(f"{base}/admin/alkstore_django/job/{job_id}/change/")
            button = page.locator("form.alk-cancel button")
            assert button.inner_text().strip().lower() == "cancel"
            page.screenshot(path=str(screenshots / "live-job-cancel.png"))
            button.click()
            page.wait_for_selector("ul.messagelist")
            assert "Asked the worker running job" in page.locator("ul.messagelist").inner_text()
            # The run heeds it at its next row: the job leaves the live table, and
            # the admin sends a page for a job that is gone back to its index.
            for _ in range(80):
                page.goto(f"{base}/admin/alkstore_django/job/{job_id}/change/")
                if "/change/" not in page.url:
                    break
                page.wait_for_timeout(250)
            else:
                raise AssertionError(f"job {job_id} still live after its cancel")
    finally:
        worker.terminate()
        worker.communicate(timeout=60)
    result = store.get_result(job_id)
    assert result.state == "cancelled" and result.tags == ("customer:7", "import")
    assert not DeadJob.objects.filter(id=job_id).exists()
    assert not Job.objects.filter(id=job_id).exists()
