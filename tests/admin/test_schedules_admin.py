"""The schedules admin: add, edit, pause, resume and delete, each validated and in History."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.urls import reverse

from alkstore_django import store
from alkstore_django.models import Schedule
from alkstore_django.scheduler import register_declared
from alkstore_django.specs import parse_spec
from tests.helpers import db_now

pytestmark = pytest.mark.django_db

ADD = reverse("admin:alkstore_django_schedule_add")
CHANGELIST = reverse("admin:alkstore_django_schedule_changelist")


def form(**overrides: str) -> dict[str, str]:
    data = {"name": "report", "spec": "@cron 0 9 * * mon-fri", "zone": "Europe/Paris",
            "misfire": "latest", "queue": "reports", "payload": '{"kind": "daily"}',
            "priority": "", "max_attempts": "", "expires_s": ""}  # fmt: skip
    return {**data, **overrides}


def change_url(row: Schedule) -> str:
    return reverse("admin:alkstore_django_schedule_change", args=[row.pk])


def test_add__registers_the_schedule_with_its_zone_next_run_and_history(admin_client):
    before = db_now()
    response = admin_client.post(ADD, form())

    assert response.status_code == 302, response.content.decode()[:2000]
    row = Schedule.objects.get(name="report")
    assert (row.zone, row.misfire, row.payload, row.declared) == (
        "Europe/Paris",
        "latest",
        {"kind": "daily"},
        False,
    )
    assert row.max_attempts == 3 and row.priority == 0  # the queue's defaults
    assert row.next_run_at == parse_spec(row.spec, row.zone).next_after(before)
    assert LogEntry.objects.filter(object_id=str(row.pk), action_flag=ADDITION).exists()


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"spec": "0 9 * * *"}, "spec", "expected &#x27;@every &lt;n&gt;&lt;unit&gt;&#x27;"),
        ({"spec": "@cron 0 25 * * *"}, "spec", "field 2 (hour) &#x27;25&#x27;"),
        ({"zone": "Europe/Pariss"}, "zone", "Invalid schedule zone"),
        ({"queue": "__alkstore_x"}, "queue", "Reserved queue name"),
        ({"max_attempts": "0"}, None, "max_attempts"),
    ],
)
def test_add__a_bad_value_is_refused_with_a_form_error(admin_client, overrides, field, message):
    response = admin_client.post(ADD, form(**overrides))

    assert response.status_code == 200
    html = response.content.decode()
    assert message in html
    errors = response.context["adminform"].form.errors
    assert (field or "__all__") in errors
    assert not Schedule.objects.exists()


def test_edit__recomputes_the_next_run_and_shows_it_in_zone_and_utc(admin_client):
    store.schedule("report", "@cron 0 9 * * *", "reports", zone="UTC")
    row = Schedule.objects.get(name="report")

    response = admin_client.post(change_url(row), form(spec="@cron 30 7 * * *", zone="Asia/Tokyo"))

    assert response.status_code == 302
    row = Schedule.objects.get(pk=row.pk)
    assert (row.spec, row.zone) == ("@cron 30 7 * * *", "Asia/Tokyo")
    local = row.next_run_at.astimezone(parse_spec(row.spec, row.zone).zone)
    assert (local.hour, local.minute) == (7, 30)
    assert row.admin_edited_at is None  # not declared in settings
    html = admin_client.get(change_url(row)).content.decode()
    assert f"{local:%Y-%m-%d %H:%M:%S} Asia/Tokyo" in html
    assert f"{row.next_run_at:%Y-%m-%d %H:%M:%S} UTC" in html
    listing = admin_client.get(CHANGELIST).content.decode().replace("<wbr>", "")
    assert f"{local:%Y-%m-%d %H:%M:%S} Asia/Tokyo" in listing
    assert f"{row.next_run_at:%Y-%m-%d %H:%M:%S} UTC" in listing
    assert LogEntry.objects.filter(object_id=str(row.pk), action_flag=CHANGE).exists()


def test_edit__a_bad_spec_is_refused_and_the_row_kept(admin_client):
    store.schedule("report", "@cron 0 9 * * *", "reports", zone="UTC")
    row = Schedule.objects.get(name="report")

    response = admin_client.post(change_url(row), form(spec="@cron 0 9 * * nope"))

    assert response.status_code == 200
    assert "field 5 (day of week)" in response.content.decode()
    assert Schedule.objects.get(pk=row.pk).spec == "@cron 0 9 * * *"


def test_edit__a_declared_schedule_is_marked_and_its_edit_recorded(admin_client, settings):
    settings.ALKSTORE = {"SCHEDULES": {"report": {"spec": "@cron 0 9 * * *", "queue": "reports"}}}
    register_declared(store)
    row = Schedule.objects.get(name="report")

    page = admin_client.get(change_url(row)).content.decode()
    assert "declared in ALKSTORE[&#x27;SCHEDULES&#x27;]" in page
    assert "settings" in admin_client.get(CHANGELIST).content.decode()
    admin_client.post(change_url(row), form(zone="UTC"))

    row = Schedule.objects.get(pk=row.pk)
    assert row.declared and row.admin_edited_at is not None


def test_pause_and_resume__are_recorded_in_history(admin_client):
    store.schedule("report", "@cron */5 * * * *", "reports", zone="UTC")
    row = Schedule.objects.get(name="report")
    Schedule.objects.filter(pk=row.pk).update(next_run_at=db_now() - timedelta(hours=2))

    for action, enabled, message in (("disable", False, "Paused."), ("enable", True, "Resumed.")):
        admin_client.post(CHANGELIST, {"action": action, "_selected_action": [row.pk]})
        assert Schedule.objects.get(pk=row.pk).enabled is enabled
        assert LogEntry.objects.filter(object_id=str(row.pk), change_message=message).exists()
    row = Schedule.objects.get(pk=row.pk)
    assert row.next_run_at > db_now()  # the missed fires are skipped on resume


def test_changelist__marks_a_refused_schedule_with_its_error(admin_client):
    store.schedule("report", "@cron */5 * * * *", "reports", zone="UTC")
    Schedule.objects.filter(name="report").update(
        refused_from=db_now(),
        last_error="PayloadError: Payload of 400 bytes is larger than MAX_PAYLOAD_BYTES (100).",
    )

    html = admin_client.get(CHANGELIST).content.decode().replace("<wbr>", "")

    assert "refused" in html and "larger than MAX_PAYLOAD_BYTES (100)" in html


def test_delete__removes_the_schedule(admin_client):
    store.schedule("report", "@cron */5 * * * *", "reports", zone="UTC")
    row = Schedule.objects.get(name="report")
    url = reverse("admin:alkstore_django_schedule_delete", args=[row.pk])

    assert admin_client.get(url).status_code == 200  # the confirmation page
    response = admin_client.post(url, {"post": "yes"})

    assert response.status_code == 302
    assert not Schedule.objects.exists()


def test_add__needs_the_add_permission(staff_client):
    client = staff_client("view_schedule")

    assert client.get(ADD).status_code == 403
    client.post(ADD, form())
    assert not Schedule.objects.exists()


def test_add__a_deeply_nested_json_payload_is_a_form_error_not_a_500(admin_client):
    deep = "[" * 100_000 + "]" * 100_000

    response = admin_client.post(ADD, form(payload=deep))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "payload" in errors and "nested" in str(errors["payload"])
    assert not Schedule.objects.exists()
