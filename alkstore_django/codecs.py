"""Payload codecs: how a payload becomes the JSON text a job stores, and what comes back.

``ALKSTORE["PAYLOAD_CODEC"]`` names one by its dotted path (a class or an
instance with ``encode(payload) -> str`` and ``decode(value) -> payload``);
the default is ``JSONCodec``. Whatever the codec, the text it produces is
held to the same rules before anything is written (no U+0000, no lone
surrogate, at most ``MAX_PAYLOAD_BYTES``), and the database column is JSON:
``decode`` receives what JSON gives back, not text.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from .validation import strict_json

# ``json.loads``'s own decoder (no options): ``load_json``.
_raw_decode = json.JSONDecoder().raw_decode


def load_json(value: Any) -> Any:
    """Decode a JSON column read as text; a driver that decoded it already passes it through.

    Every claimed job's payload comes through here, before its codec's
    ``decode``. ``raw_decode`` is ``json.loads`` without its two whitespace
    scans and the calls around them (a microsecond of a payload's one to
    two); what it does not read to the end (surrounding whitespace, an
    error) goes to ``json.loads``, which reads it or raises as before.
    """
    if isinstance(value, str):
        try:
            decoded, end = _raw_decode(value)
        except ValueError:
            return json.loads(value)
        return decoded if end == len(value) else json.loads(value)
    return json.loads(value) if isinstance(value, bytes) else value


class JSONCodec:
    """Strict JSON, the default: a payload comes back equal, or is refused.

    NaN and infinities, sets, bytes, datetimes and other non-JSON values raise
    ``PayloadError`` at enqueue.
    """

    def encode(self, payload: Any) -> str:
        """Return ``payload`` as compact JSON; TypeError or ValueError when it is not JSON."""
        return strict_json(payload)

    def decode(self, value: Any) -> Any:
        """Return the payload stored as ``value`` (as JSON gave it back)."""
        return value


class DjangoJSONCodec(JSONCodec):
    """JSON that also accepts what ``DjangoJSONEncoder`` does: datetimes, Decimal, UUID…

    The round-trip caveat: those values are written as strings (ISO 8601 for
    dates and times, the digits of a Decimal, the hex of a UUID) and come back
    as those strings: ``job.payload["when"]`` is ``"2026-11-30T09:00:00Z"``,
    not a datetime. Parse them in the handler. NaN and infinities are still
    refused.
    """

    def __init__(self) -> None:
        self._encoder = DjangoJSONEncoder(
            allow_nan=False, separators=(",", ":"), ensure_ascii=False
        )

    def encode(self, payload: Any) -> str:
        """Return ``payload`` as JSON, datetimes, Decimals and UUIDs as strings."""
        return self._encoder.encode(payload)
