"""What every alkstore admin shares: the store's database, read-only forms, id search,
timestamps to the second, History entries, and a clear 400 for a NUL in the query string.

Every page (``dead_letters``, ``live_jobs``, ``locks``, ``queue_controls``,
``results``, ``schedules``, ``workers``, ``workflows``, ``tasks.admin``) builds on
these; a page added later gets the same behaviour by extending
``AlkstoreModelAdmin``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_permission_codename
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.db.models import DateTimeField, Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from ..conf import app_settings
from ..display import format_timestamp
from ..errors import InvalidArgument
from ..models import DeadJob, Job
from ..operations import with_tag
from ..records import split_tags
from ..validation import parse_id

_BREAK_AFTER = re.compile(r"(?<=[.:/_-])")
# A bold red word beside a value (``format_html(WARNING_MARK, css_class, word)``).
WARNING_MARK = '<strong class="{}" style="color: #ba2121">{}</strong>'


def has_perm(request: HttpRequest, opts: Any, action: str) -> bool:
    """Return whether the user holds ``action`` (view, delete, requeue…) on the model ``opts``."""
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


def pre(value: str) -> str:
    """Return ``value`` escaped in a wrapping ``<pre>``: payloads and errors are shown as text."""
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', value)


def breakable(text: str) -> str:
    """Return ``text`` escaped, with a line-break opportunity after each ``. : / _ -``.

    Worker ids, queue names and zones are long unbroken words: without these
    a list column is as wide as its longest one.
    """
    parts = [part for part in _BREAK_AFTER.split(text) if part]
    return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in parts))


def job_link(job_id: int, gone: str, live: str = "live job") -> str:
    """Link to job ``job_id``'s page while it is live or a dead letter (same id); else ``gone``."""
    using = app_settings.database
    for model, kind in ((Job, live), (DeadJob, "dead letter")):
        if model.objects.using(using).filter(id=job_id).exists():
            meta = model._meta
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[job_id])
            return format_html('<a href="{}">{} {}</a>', url, kind, job_id)
    return gone


def workflow_step_link(workflow_id: int | None, step: str | None) -> str:
    """Return a job's workflow and step as a link to the step on its workflow's page; - if none."""
    if workflow_id is None:
        return "-"
    url = reverse("admin:alkstore_django_workflow_change", args=[workflow_id])
    query = urlencode({"step": step or ""})
    return format_html(
        '<a href="{}?{}#alk-selected-step">step {} of workflow {}</a>',
        url,
        query,
        repr(step),
        workflow_id,
    )


def seconds_column(model: type[Model], name: str) -> Callable[[Model], str]:
    """Return a changelist column showing the datetime field ``name`` to the second.

    Django's default ``DATETIME_FORMAT`` stops at the minute; operators compare
    deaths and claim deadlines seconds apart. The column sorts by the field.
    """
    field = model._meta.get_field(name)
    description = str(getattr(field, "verbose_name", name))

    @admin.display(description=description, ordering=name)
    def column(obj: Model) -> str:
        return format_timestamp(getattr(obj, name))

    column.__name__ = name  # keeps Django's "column-<name>" and "field-<name>" classes
    return column


class AlkstoreModelAdmin(admin.ModelAdmin):
    """Rows live in ``ALKSTORE["DATABASE"]``; forms are read-only; times show seconds."""

    #: The detail page's buttons: the template's flag -> the permission check it shows on.
    page_buttons: dict[str, str] = {}

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        flags = {flag: getattr(self, check)(request) for flag, check in self.page_buttons.items()}
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), **flags})

    def button_url(
        self, suffix: str, view: Callable[[HttpRequest, str], HttpResponse], name: str
    ) -> URLPattern:
        """The URL of a detail page's button: POST only, behind the admin's login."""
        return path(
            f"<path:object_id>/{suffix}/", self.admin_site.admin_view(require_POST(view)), name=name
        )

    def button_target(self, request: HttpRequest, object_id: str, permitted: bool) -> Any:
        """Return the object a detail page's button acts on, None when it is gone meanwhile."""
        if not permitted:
            raise PermissionDenied
        return self.get_object(request, unquote(object_id))

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(app_settings.database)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_list_display(self, request: HttpRequest) -> Any:
        """Show every datetime field of ``list_display`` to the second."""
        columns: list[Any] = []
        for item in super().get_list_display(request):
            if isinstance(item, str) and self._is_datetime_field(item):
                columns.append(seconds_column(self.model, item))
            else:
                columns.append(item)
        return columns

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """On a read-only detail page, show every datetime field to the second.

        Django renders a read-only datetime with ``DATETIME_FORMAT``, which
        stops at the minute. An editable form (a schedule for who may change
        it) keeps Django's own fields.
        """
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or self.has_change_permission(request, obj):
            return fieldsets
        return [
            (title, {**options, "fields": [self._to_the_second(f) for f in options["fields"]]})
            for title, options in fieldsets
        ]

    def _to_the_second(self, field: Any) -> Any:
        if isinstance(field, list | tuple):
            return type(field)(self._to_the_second(f) for f in field)
        if isinstance(field, str) and self._is_datetime_field(field):
            return seconds_column(self.model, field)
        return field

    def _is_datetime_field(self, name: str) -> bool:
        try:
            return isinstance(self.model._meta.get_field(name), DateTimeField)
        except FieldDoesNotExist:
            return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # No stored text holds a NUL, and PostgreSQL refuses one in a query
        # parameter (a 500 from a filter or search otherwise).
        for key, values in request.GET.lists():
            if any("\x00" in text for text in (key, *values)):
                return HttpResponseBadRequest(
                    f"Invalid query parameter {key!r}: a NUL character matches no stored "
                    "value; remove it from the address.",
                    content_type="text/plain; charset=utf-8",
                )
        return super().changelist_view(request, extra_context)

    def log_action(
        self, request: HttpRequest, objects: Iterable[Model], message: str, *, flag: int = CHANGE
    ) -> None:
        """Record ``message`` in Django's History (``LogEntry``) for each of ``objects``.

        Pass the objects as they were before the action (a requeued dead letter
        or a cancelled job is gone afterwards); ``flag`` is ``CHANGE`` or
        ``DELETION`` from ``django.contrib.admin.models``.
        """
        rows = list(objects)
        user_id = request.user.pk
        assert user_id is not None, "admin views are for logged-in staff only"
        if rows:
            LogEntry.objects.log_actions(user_id, rows, flag, change_message=message)


class JobIdSearchMixin:
    """Search matches a job id exactly when the term is a number, besides the text fields."""

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        found, may_have_duplicates = super().get_search_results(  # type: ignore[misc]
            request, queryset, search_term
        )
        job_id = parse_id(search_term)
        if job_id is not None:
            # Both sides start from the filtered queryset, so list filters still apply.
            found |= queryset.filter(pk=job_id)
        return found, may_have_duplicates


# A search term ``tag:customer:7`` keeps the rows with that tag.
TAG_SEARCH_PREFIX = "tag:"
# The tag filter lists the tags of this many newest rows, not of the whole table.
TAG_SAMPLE_ROWS = 500
TAG_CHOICES_SHOWN = 50


def tagged(queryset: QuerySet, tag: str) -> QuerySet:
    """Return the rows of ``queryset`` with the tag ``tag`` (``operations.with_tag``).

    A term no tag can be matches nothing (a 200 with no rows, not an error).
    """
    try:
        return with_tag(queryset, tag.strip().lower())
    except InvalidArgument:
        return queryset.none()


class TagFilter(admin.SimpleListFilter):
    """Filter by one tag: ``?tag=customer:7``; the choices are the tags of the newest rows.

    Listing every tag ever used would read every row; the newest
    ``TAG_SAMPLE_ROWS`` rows (by primary key: an index scan) give the likely
    choices. Any other tag is reached by its address or a ``tag:`` search.
    """

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        model = model_admin.model
        newest = model._default_manager.using(app_settings.database).order_by("-pk")
        seen: set[str] = set()
        for stored in newest.values_list("tags", flat=True)[:TAG_SAMPLE_ROWS]:
            seen.update(split_tags(stored))
        names = sorted(seen)[:TAG_CHOICES_SHOWN]
        chosen = self.value()
        # Keep the chosen tag listed when no recent row has it.
        if chosen is not None and chosen not in names:
            names = sorted([*names, chosen])
        return [(tag, tag) for tag in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset if value is None else tagged(queryset, value)


class TagsMixin:
    """Search by tag, and the ``tag_list`` column: each tag a link to its filter.

    A term ``tag:customer:7`` keeps only the rows with that tag (several such
    terms: all of them), the other terms search as before; a search that is
    one word and a tag also finds the rows with that tag.
    """

    model: type[Model]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        terms = search_term.split()
        for term in terms:
            if term.lower().startswith(TAG_SEARCH_PREFIX):
                queryset = tagged(queryset, term[len(TAG_SEARCH_PREFIX) :])
        rest = [term for term in terms if not term.lower().startswith(TAG_SEARCH_PREFIX)]
        found, may_have_duplicates = super().get_search_results(  # type: ignore[misc]
            request, queryset, " ".join(rest)
        )
        if len(rest) == 1:
            # Both sides start from the filtered queryset, so list filters still apply.
            found |= tagged(queryset, rest[0])
        return found, may_have_duplicates

    @admin.display(description="tags")
    def tag_list(self, obj: Model) -> str:
        tags = split_tags(getattr(obj, "tags", None))
        if not tags:
            return "-"
        meta = self.model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        return format_html_join(
            ", ", '<a href="{}?{}">{}</a>', ((url, urlencode({"tag": t}), t) for t in tags)
        )
