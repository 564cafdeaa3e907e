"""A JSON endpoint that places an order."""

from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from . import services


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """POST {"email": ..., "total_cents": ...} → the new order's id."""
    try:
        data = json.loads(request.body)
        order = services.place_order(data["email"], int(data["total_cents"]))
    except (ValueError, KeyError, TypeError) as exc:
        return JsonResponse({"error": f"bad order: {exc}"}, status=400)
    return JsonResponse({"order_id": order.pk}, status=201)
