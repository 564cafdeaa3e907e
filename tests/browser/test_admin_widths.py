"""The schedules and live-workers lists fit a 1280 px window, nav sidebar open, beside the filters.

Driven in Debian's Chromium through Playwright, as ``test_admin_browser``; skipped
with the reason when either is missing. Screenshots go to a temporary folder.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from alkstore_django import presence, store
from tests.browser.test_admin_browser import PASSWORD, chromium, log_in
from tests.factories import ScheduleFactory

WIDTH = 1280


def populate_wide_rows() -> None:
    """Schedules and workers with the long names, specs and errors a real site has."""
    now = timezone.now()
    store.schedule(
        "weekday-morning-sales-report-for-the-regional-managers",
        "@cron 30 7 * * mon-fri",
        "reports.regional-sales",
        zone="America/Argentina/Buenos_Aires",
        misfire="latest",
    )
    ScheduleFactory(
        name="nightly-digest-of-abandoned-carts",
        spec="@every 1d",
        interval_s=86_400,
        queue="emails.transactional-digest",
        last_fired_at=now - timedelta(hours=3),
        last_error="ConnectionError: no answer from smtp-relay.internal.example.com:587, 3 tries",
        last_error_at=now - timedelta(hours=3),
    )
    for n in range(3):
        presence.announce(
            "default",
            f"worker-pool-eu-west-1b-ip-10-42-{n}-17.ec2.internal:48213:9f3c2a",
            queues=["emails.transactional-digest", "reports.regional-sales", "thumbnails"],
            pool="processes",
            concurrency=16,
            counts=(1_234_567, 8_901, 23),
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page_path", ["schedule", "liveworker"])
def test_admin_list__fits_a_1280_px_window(live_server, tmp_path, page_path):
    populate_wide_rows()
    User.objects.create_superuser("operator", "ops@example.com", PASSWORD)
    with chromium() as browser:
        page = browser.new_page()
        page.set_viewport_size({"width": WIDTH, "height": 800})
        log_in(page, live_server.url)
        page.goto(f"{live_server.url}/admin/alkstore_django/{page_path}/")
        if page.locator("#nav-sidebar").is_hidden():
            page.click("#toggle-nav-sidebar")
        page.wait_for_selector("#result_list")
        results = page.locator("#changelist .results")
        overflow = results.evaluate("el => el.scrollWidth - el.clientWidth")
        page_overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        page.screenshot(path=str(tmp_path / f"{page_path}-{WIDTH}.png"), full_page=True)
        page.close()
    assert overflow <= 0, f"the {page_path} table is {overflow} px too wide at {WIDTH} px"
    assert page_overflow <= 0, f"the {page_path} page scrolls {page_overflow} px sideways"
