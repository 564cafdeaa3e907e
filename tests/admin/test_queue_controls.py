"""The overview's Pause/Resume buttons: one service call, a History entry, a message."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from alkstore_django import store
from alkstore_django.models import QueueControl

pytestmark = pytest.mark.django_db

CONTROL = "admin:alkstore_django_queue_control"


def control(client, queue: str, action: str):
    return client.post(reverse(CONTROL), {"queue": queue, "action": action}, follow=True)


def test_overview__shows_a_paused_queue_plainly_with_a_resume_button(admin_client):
    store.queue("ov.p").enqueue(1)
    store.queue("ov.p").pause()
    store.queue("ov.r").enqueue(1)
    response = admin_client.get(reverse("admin:alkstore_django_overview"))
    rows = {s.queue: s for s, *_ in response.context["rows"]}
    assert (rows["ov.p"].paused, rows["ov.r"].paused) == (True, False)
    html = response.content.decode()
    paused_row = html[html.index('data-queue="ov.p"') :].split("</tr>")[0]
    assert 'class="alk-warn alk-paused">paused<' in paused_row
    assert 'value="resume">Resume<' in paused_row
    running_row = html[html.index('data-queue="ov.r"') :].split("</tr>")[0]
    assert 'value="pause">Pause<' in running_row


def test_pause_button__pauses_records_history_and_says_so(admin_client, admin_user):
    q = store.queue("ov.p")
    q.enqueue(1)
    response = control(admin_client, "ov.p", "pause")
    assert response.status_code == 200
    assert q.is_paused() is True
    assert q.claim_one("w") is None
    assert "Queue &#x27;ov.p&#x27;: Paused" in response.content.decode()
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.user_id) == ("ov.p", admin_user.pk)
    assert entry.get_change_message().startswith("Paused")
    control(admin_client, "ov.p", "resume")
    assert q.is_paused() is False
    assert LogEntry.objects.count() == 2


def test_pause_button__on_a_paused_queue_changes_nothing_and_warns(admin_client):
    store.queue("ov.p").pause()
    response = control(admin_client, "ov.p", "pause")
    assert "was already paused" in response.content.decode()
    assert not LogEntry.objects.exists()


def test_pause_button__needs_the_change_queuecontrol_permission(staff_client):
    client = staff_client("view_job", "view_deadjob")
    page = client.get(reverse("admin:alkstore_django_overview")).content.decode()
    assert 'value="pause"' not in page  # not offered
    response = client.post(reverse(CONTROL), {"queue": "ov.p", "action": "pause"})
    assert response.status_code == 403  # nor accepted from a forged POST
    assert not QueueControl.objects.exists()


def test_pause_button__allowed_with_the_permission(staff_client):
    client = staff_client("view_job", "change_queuecontrol")
    control(client, "ov.p", "pause")
    assert store.queue("ov.p").is_paused() is True


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"queue": "ov.p", "action": "stop"}, "Invalid action 'stop'"),
        ({"queue": "", "action": "pause"}, "Invalid queue name ''"),
    ],
)
def test_control__a_bad_request_is_a_400_naming_the_value(admin_client, data, message):
    response = admin_client.post(reverse(CONTROL), data)
    assert response.status_code == 400
    assert message in response.content.decode()


def test_control__is_post_only(admin_client):
    assert admin_client.get(reverse(CONTROL)).status_code == 405


def test_queue_control_history__lists_who_paused_and_resumed(admin_client):
    control(admin_client, "ov.p", "pause")
    control(admin_client, "ov.p", "resume")
    url = reverse("admin:alkstore_django_queuecontrol_history", args=["ov.p"])
    html = admin_client.get(url).content.decode()
    assert "Paused: workers claim nothing from it" in html
    assert "Resumed: workers claim from it again." in html
    change = admin_client.get(reverse("admin:alkstore_django_queuecontrol_change", args=["ov.p"]))
    assert change.status_code == 200
    assert 'name="_save"' not in change.content.decode()  # read-only
