"""Queue controls: the overview's Pause/Resume button and each queue's control row.

The button posts to ``deadjob/overview/control/`` (URL name
``alkstore_django_queue_control``); ``QueueControlAdmin`` lists the rows
read-only, with who paused and resumed each queue in its History.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse

from .. import operations
from ..conf import app_settings
from ..errors import AlkstoreError
from ..models import QueueControl
from .base import AlkstoreModelAdmin
from .base import has_perm as _has_perm

CONTROL_ACTIONS = {"pause": True, "resume": False}
MAX_REFRESH_S = 3600


def refresh_seconds(raw: str | None) -> int | None:
    """Return the overview's ``?refresh=`` seconds (None: off); raise ValueError naming bad ones."""
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_REFRESH_S):
        raise ValueError(
            f"Invalid refresh {raw!r}: expected whole seconds from 1 to {MAX_REFRESH_S}, "
            "or no refresh parameter for none."
        )
    return int(raw)


def overview_url(refresh: str | None) -> str:
    """Return the overview's address, keeping a valid ``?refresh=`` (an invalid one is dropped)."""
    url = reverse("admin:alkstore_django_overview")
    try:
        refresh_s = refresh_seconds(refresh)
    except ValueError:
        return url
    return url if refresh_s is None else f"{url}?refresh={refresh_s}"


def can_pause_queues(request: HttpRequest) -> bool:
    """Pausing and resuming queues needs ``change_queuecontrol``."""
    return _has_perm(request, QueueControl._meta, "change")


class QueueControlViews(AlkstoreModelAdmin):
    """The Pause/Resume button's view, mixed into the admin that serves the overview."""

    def queue_control_urls(self) -> list[URLPattern]:
        """Return the button's URL (``overview/control/``), ahead of the model's own."""
        control = self.admin_site.admin_view(self.queue_control_view)
        return [path("overview/control/", control, name="alkstore_django_queue_control")]

    def queue_control_view(self, request: HttpRequest) -> HttpResponse:
        """The overview's Pause/Resume button: POST ``queue`` and ``action`` (pause, resume)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not can_pause_queues(request):
            raise PermissionDenied
        queue, action = request.POST.get("queue", ""), request.POST.get("action", "")
        if action not in CONTROL_ACTIONS:
            return HttpResponseBadRequest(
                f"Invalid action {action!r}: expected pause or resume.",
                content_type="text/plain; charset=utf-8",
            )
        using = app_settings.queue_alias(queue)
        try:
            changed = operations.set_queue_paused(queue, CONTROL_ACTIONS[action], using=using)
        except AlkstoreError as exc:
            return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
        # The button keeps the page's auto-refresh (a hidden field of its form).
        overview = overview_url(request.POST.get("refresh"))
        if not changed:
            state = "paused" if CONTROL_ACTIONS[action] else "running"
            self.message_user(request, f"Queue {queue!r} was already {state}.", messages.WARNING)
            return HttpResponseRedirect(overview)
        control = QueueControl.objects.using(using).get(queue=queue)
        if CONTROL_ACTIONS[action]:
            text = "Paused: workers claim nothing from it; running jobs finish."
        else:
            text = "Resumed: workers claim from it again."
        self.log_action(request, [control], text)
        self.message_user(request, f"Queue {queue!r}: {text}")
        return HttpResponseRedirect(overview)


@admin.register(QueueControl)
class QueueControlAdmin(AlkstoreModelAdmin):
    """Each queue's pause row and rate window, read-only: the overview's buttons change them.

    Its change page's History lists who paused and resumed the queue.
    """

    list_display = ("queue", "paused", "paused_at", "window_at", "window_starts")
    list_filter = ("paused",)
    search_fields = ("queue",)
    ordering = ("queue",)
    actions: list[Any] = []

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting the row would resume a paused queue behind the History's back.
        return False
