"""System check alkstore.E007: ``ALKSTORE["SCHEDULES"]`` is validated at start-up."""

from __future__ import annotations

import pytest
from django.test import override_settings

from alkstore_django.checks import check_settings


def e007(schedules) -> list[str]:
    with override_settings(ALKSTORE={"SCHEDULES": schedules}):
        return [e.msg for e in check_settings() if e.id == "alkstore.E007"]


def test_check__accepts_well_formed_schedules():
    assert (
        e007(
            {
                "nightly-report": {
                    "spec": "@every 1d",
                    "queue": "reports",
                    "payload": {"report": "nightly"},
                    "priority": 5,
                    "max_attempts": 2,
                    "expires_s": 3600,
                },
                "heartbeat": {"spec": "@every 30s", "queue": "pings"},
                "weekday": {
                    "spec": "@cron 0 9 * * mon-fri",
                    "queue": "reports",
                    "zone": "Europe/Paris",
                    "misfire": "latest",
                },
            }
        )
        == []
    )


@pytest.mark.parametrize(
    ("schedules", "fragment"),
    [
        (["nightly-report"], "list, not a dict"),
        ({"nightly-report": "@every 1d"}, "expected a dict"),
        ({"nightly-report": {"spec": "0 3 * * *", "queue": "reports"}}, "'0 3 * * *'"),
        ({"nightly-report": {"spec": "@every 1d"}}, "Missing schedule key 'queue'"),
        ({"nightly-report": {"queue": "reports"}}, "Missing schedule key 'spec'"),
        ({"nightly-report": {"spec": "@every 1d", "queue": "q", "cron": "x"}}, "'cron'"),
        ({"nightly-report": {"spec": "@every 1d", "queue": "__alkstore_outbox:x"}}, "Reserved"),
        ({"": {"spec": "@every 1d", "queue": "reports"}}, "schedule name ''"),
        ({"r": {"spec": "@every 1d", "queue": "q", "max_attempts": 0}}, "max_attempts 0"),
        ({"r": {"spec": "@every 1d", "queue": "q", "payload": {1, 2}}}, "cannot be encoded"),
        ({"r": {"spec": "@cron 0 9 * * 8", "queue": "q"}}, "field 5 (day of week) '8'"),
        ({"r": {"spec": "@cron 0 9 * * 1", "queue": "q", "zone": "Paris"}}, "zone 'Paris'"),
        ({"r": {"spec": "@cron @daily", "queue": "q", "misfire": "some"}}, "policy 'some'"),
    ],
)  # fmt: skip
def test_check__names_the_bad_schedule(schedules, fragment):
    messages = e007(schedules)

    assert len(messages) == 1
    assert fragment in messages[0]
