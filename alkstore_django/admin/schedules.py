"""The schedules admin: add, edit, pause, resume and delete, validated as ``schedule()`` is.

A save goes through ``scheduler.schedule`` (the same checks, the same upsert
and the same next-run computation as code and settings), never a bare model
save. A schedule declared in ``ALKSTORE["SCHEDULES"]`` is marked; editing it
here records when, so the scheduler's next start, which re-applies the
declaration, says in its log what it overwrote.
"""

from __future__ import annotations

import sys
from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.forms.fields import InvalidJSONInput
from django.forms.models import BaseModelForm
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from .. import operations
from ..display import error_summary, format_timestamp
from ..errors import AlkstoreError
from ..models import Schedule
from ..scheduler.registry import check_schedule, default_zone, schedule
from ..specs import parse_spec, parse_zone
from ..store import Store
from ..validation import validate_name
from .base import AlkstoreModelAdmin, breakable, seconds_column
from .base import has_perm as _has_perm
from .base import pre as _pre

MARK = '<span class="{}" style="font-weight: bold">{}</span>'
EDITABLE = ("name", "spec", "zone", "misfire", "queue", "payload", "priority", "max_attempts",
            "expires_s")  # fmt: skip
# The read-only part of an edit form; its times to the second (one column object
# each, as both the fields and the read-only fields must name the same one).
SHOWN = ("declared", "enabled", "next_run_in_zone", "next_run_utc",
         *(seconds_column(Schedule, name) for name in ("last_fired_at", "refused_from",
                                                      "last_error_at")),
         "last_error_text")  # fmt: skip


class PayloadField(forms.JSONField):
    """A JSON field whose text nested too deeply to read is a form error, not a 500."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            preview = value if len(value) <= 40 else value[:37] + "..."
            raise ValidationError(
                f"Invalid payload {preview!r}: JSON nested too deeply to read; expected "
                f"fewer levels than Python's recursion limit ({sys.getrecursionlimit()}).",
                code="invalid",
            ) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        # The form shown again with its error re-reads the text: keep it as typed.
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)


class ScheduleForm(forms.ModelForm):
    """Each argument checked where it belongs, so the error sits under its field."""

    payload = PayloadField(required=False, help_text="JSON; encoded with PAYLOAD_CODEC.")
    priority = forms.IntegerField(required=False, help_text="Blank: the queue's default.")
    max_attempts = forms.IntegerField(required=False, help_text="Blank: the queue's default.")
    expires_s = forms.FloatField(required=False, help_text="Blank: the queue's default.")
    zone = forms.CharField(
        required=False, max_length=64, help_text="An IANA zone; blank: settings.TIME_ZONE."
    )

    class Meta:
        model = Schedule
        fields = EDITABLE
        help_texts = {
            "spec": "'@every 15m', '@cron 0 9 * * mon-fri' (5 fields, or 6 with a leading "
            "second) or '@cron @daily'.",
            "misfire": "Boundaries missed while no scheduler ran: all (at most 64 per tick), "
            "latest (one fire), skip (none).",
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        zone = data.get("zone") or default_zone()
        checks = [
            ("name", lambda: validate_name("schedule", data.get("name"))),
            ("queue", lambda: validate_name("queue", data.get("queue"))),
            ("zone", lambda: parse_zone(zone)),
            ("spec", lambda: parse_spec(data.get("spec"), zone)),
        ]
        for field, check in checks:
            if field in self.fields:
                try:
                    check()
                except AlkstoreError as exc:
                    self.add_error(field, str(exc))
        if self.errors:
            return data
        try:
            values = check_schedule(
                data.get("name", self.instance.name),
                data["spec"],
                data["queue"],
                data.get("payload"),
                priority=data.get("priority"),
                max_attempts=data.get("max_attempts"),
                expires_s=data.get("expires_s"),
                zone=zone,
                misfire=data.get("misfire") or "all",
            )
        except AlkstoreError as exc:
            self.add_error(None, str(exc))
            return data
        # The stamps as the queue resolves them, so the model sees no blanks.
        for key in ("priority", "max_attempts", "expires_s", "zone"):
            data[key] = values[key]
        return data


class ScheduleAdmin(AlkstoreModelAdmin):
    form = ScheduleForm
    # Fits a 1280 px window beside the nav sidebar and the filters: the zone and
    # misfire policy sit under the spec, the origin under the state, UTC under the zone's
    # time, the last error under the last fire.
    list_display = ("name", "timing", "queue_name", "state", "next_run", "last_fire")
    list_filter = ("enabled", "declared", "misfire", "queue")
    search_fields = ("name", "queue")
    ordering = ("name",)
    actions = ["enable", "disable", "delete_selected"]

    # --- permissions: Django's own, as for any model ---------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "add")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _has_perm(request, self.opts, "change")

    def has_toggle_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "change")

    # --- the form -----------------------------------------------------------------------

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return EDITABLE if obj is None else (*EDITABLE, *SHOWN)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        # A schedule is upserted by name: renaming would register a second one.
        return ("name", *SHOWN)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        row = self.get_queryset(request).filter(pk=object_id).only("declared").first()
        if row is not None and row.declared and request.method == "GET":
            messages.warning(
                request,
                "This schedule is declared in ALKSTORE['SCHEDULES']: the scheduler's next "
                "start re-applies the declaration over an edit made here, and logs what it "
                "overwrote.",
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: BaseModelForm, change: bool
    ) -> None:
        """Register through ``scheduler.schedule``: the one path that validates and upserts."""
        data = form.cleaned_data
        using = self.get_queryset(request).db
        declared = bool(change and obj.declared)
        schedule(
            Store(using),
            obj.name,
            data["spec"],
            data["queue"],
            data.get("payload"),
            priority=data["priority"],
            max_attempts=data["max_attempts"],
            expires_s=data["expires_s"],
            zone=data["zone"],
            misfire=data["misfire"],
            declared=declared,
        )
        rows = Schedule.objects.using(using).filter(name=obj.name)
        if declared:
            rows.update(admin_edited_at=Now())
        saved = rows.get()
        obj.pk, obj.next_run_at = saved.pk, saved.next_run_at

    # --- columns ------------------------------------------------------------------------

    @admin.display(description="origin", ordering="declared")
    def origin(self, obj: Schedule) -> str:
        return "settings" if obj.declared else "code or admin"

    @admin.display(description="spec", ordering="spec")
    def timing(self, obj: Schedule) -> str:
        return format_html("{}<br>{}, misfire {}", obj.spec, breakable(obj.zone), obj.misfire)

    @admin.display(description="state", ordering="enabled")
    def state(self, obj: Schedule) -> str:
        return format_html("{}<br>{}", "active" if obj.enabled else "paused", self.origin(obj))

    @admin.display(description="queue", ordering="queue")
    def queue_name(self, obj: Schedule) -> str:
        return breakable(obj.queue)

    @admin.display(description="last fire", ordering="last_fired_at")
    def last_fire(self, obj: Schedule) -> str:
        summary = breakable(error_summary(obj.last_error)) if obj.last_error else "-"
        if obj.refused_from is not None:
            summary = format_html(MARK + " {}", "alk-refused", "refused", summary)
        return format_html("{}<br>{}", format_timestamp(obj.last_fired_at), summary)

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str:
        return format_html(
            "{}<br>{}", breakable(self.next_run_in_zone(obj)), self.next_run_utc(obj)
        )

    @admin.display(description="next run (zone)", ordering="next_run_at")
    def next_run_in_zone(self, obj: Schedule) -> str:
        try:
            local = obj.next_run_at.astimezone(ZoneInfo(obj.zone))
        except (ValueError, KeyError):
            return "-"
        return f"{local:%Y-%m-%d %H:%M:%S} {obj.zone}"

    @admin.display(description="next run (UTC)", ordering="next_run_at")
    def next_run_utc(self, obj: Schedule) -> str:
        return f"{obj.next_run_at.astimezone(ZoneInfo('UTC')):%Y-%m-%d %H:%M:%S} UTC"

    @admin.display(description="last error", ordering="last_error_at")
    def error(self, obj: Schedule) -> str:
        if obj.refused_from is not None:
            return format_html(
                MARK + " {}", "alk-refused", "refused", error_summary(obj.last_error)
            )
        return error_summary(obj.last_error) or "-"

    @admin.display(description="last error")
    def last_error_text(self, obj: Schedule) -> str:
        return _pre(obj.last_error) if obj.last_error else "-"

    # --- actions ------------------------------------------------------------------------

    @admin.action(description="Resume selected schedules", permissions=["toggle"])
    def enable(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._toggle(request, queryset, True, "Resumed")

    @admin.action(description="Pause selected schedules", permissions=["toggle"])
    def disable(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._toggle(request, queryset, False, "Paused")

    def _toggle(self, request: HttpRequest, queryset: QuerySet, enabled: bool, verb: str) -> None:
        """Pause or resume through ``operations``, with a History entry per schedule changed."""
        rows = list(queryset.filter(enabled=not enabled))
        changed = operations.set_schedules_enabled([r.pk for r in rows], enabled, using=queryset.db)
        self.log_action(request, rows, f"{verb}.")
        self.message_user(request, f"{verb} {changed} schedule(s).")


admin.site.register(Schedule, ScheduleAdmin)
