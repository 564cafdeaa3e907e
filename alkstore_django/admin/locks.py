"""The locks: each named lease with its owner, fence and expiry, shown and never changed."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import BooleanField, Case, QuerySet, Value, When
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.html import format_html

from ..models import Lock
from .base import WARNING_MARK, AlkstoreModelAdmin


@admin.register(Lock)
class LockAdmin(AlkstoreModelAdmin):
    list_display = ("name", "owner", "fence", "acquired_at", "expires_at", "lease")
    search_fields = ("name", "owner")
    ordering = ("name",)
    actions: list[Any] = []

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        expired = Case(
            When(expires_at__lte=Now(), then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
        return super().get_queryset(request).annotate(is_expired=expired)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting a lease would restart its fencing token: locks are only shown.
        return False

    @admin.display(description="lease", ordering="is_expired")
    def lease(self, obj: Lock) -> str:
        if getattr(obj, "is_expired", False):
            return format_html(WARNING_MARK, "alk-expired", "expired")
        return "held"
