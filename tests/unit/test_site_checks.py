"""System checks on what the site wires up: W004 (a schedule's queue), W005 (the metrics view)."""

from __future__ import annotations

import sys

from django.conf import settings
from django.core import checks
from django.test import override_settings

from alkstore_django.checks import check_metrics_view, check_schedule_handlers
from tests.helpers import check_ids


def test_schedule_on_a_queue_without_handler__warns_naming_schedule_and_queue():
    schedules = {
        "orphan": {"spec": "@every 1h", "queue": "nobody.home"},
        "fine": {"spec": "@every 1h", "queue": "t.record"},
    }
    with override_settings(ALKSTORE={"SCHEDULES": schedules}):
        messages = check_schedule_handlers()
        registered = checks.run_checks(tags=[checks.Tags.compatibility])
    assert check_ids(messages) == ["alkstore.W004"]
    assert "['orphan'] targets queue 'nobody.home', which has no handler" in messages[0].msg
    assert "alkstore.W004" in check_ids(registered)  # before the fix: check passed silently


def test_schedule_checks__no_schedules_or_bad_ones_are_left_to_other_checks():
    for raw in [None, {}, {"SCHEDULES": "x"}, {"SCHEDULES": {"a": 3, "b": {"spec": "@every 1h"}}}]:
        with override_settings(ALKSTORE=raw):
            assert check_schedule_handlers() == []


def test_metrics_view_routed_without_prometheus_client__warns_naming_the_route(monkeypatch):
    # tests.urls routes alkstore/metrics to metrics_view; None in sys.modules makes import fail.
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    messages = check_metrics_view()
    assert check_ids(messages) == ["alkstore.W005"]
    assert "routes 'alkstore/metrics' to alkstore_django.metrics.metrics_view" in messages[0].msg
    assert "alkstore.W005" in check_ids(checks.run_checks(tags=[checks.Tags.urls]))


def test_metrics_view__no_warning_with_prometheus_client_or_without_the_route(monkeypatch):
    assert check_metrics_view() == []
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with override_settings(ROOT_URLCONF="tests.testapp.jobs"):  # a module with no urlpatterns
        assert check_metrics_view() == []


def test_metrics_view__a_site_without_a_urlconf_gets_no_warning_and_no_crash(monkeypatch):
    """A worker-only settings module may set no ROOT_URLCONF: ``check`` must still run."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with override_settings():
        del settings.ROOT_URLCONF
        assert check_metrics_view() == []
