"""Payload codecs: strict JSON by default, Django's encoder on request, a site's own."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from alkstore_django import checks, store
from alkstore_django.errors import PayloadError
from tests.helpers import ROUTING, live_count

pytestmark = pytest.mark.django_db

DJANGO_CODEC = {**ROUTING, "PAYLOAD_CODEC": "alkstore_django.codecs.DjangoJSONCodec"}
WHEN = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


class Reviving:
    """A site's own codec: the Django encoder, and ISO timestamps revived on the way back."""

    def encode(self, payload):
        from alkstore_django.codecs import DjangoJSONCodec

        return DjangoJSONCodec().encode(payload)

    def decode(self, value):
        return {k: datetime.fromisoformat(v) if k.endswith("_at") else v for k, v in value.items()}


def test_default_codec__refuses_a_datetime_and_writes_nothing():
    with pytest.raises(PayloadError, match="cannot be encoded as JSON"):
        store.queue("c.q").enqueue({"at": WHEN})
    assert live_count() == 0


def test_django_codec__accepts_datetime_decimal_and_uuid_which_come_back_as_strings(settings):
    settings.ALKSTORE = DJANGO_CODEC
    job_id = store.queue("c.q").enqueue({"at": WHEN, "price": Decimal("9.90"), "id": ID})
    payload = store.get_job(job_id).payload
    assert payload == {"at": "2026-11-30T09:00:00Z", "price": "9.90", "id": str(ID)}
    handle = store.queue("c.q").claim_one("w")
    assert handle.job.payload == payload  # the claim path decodes the same way


def test_django_codec__still_refuses_nan_and_nul(settings):
    settings.ALKSTORE = DJANGO_CODEC
    for bad in ({"x": float("nan")}, {"x": "a\x00b"}):
        with pytest.raises(PayloadError):
            store.queue("c.q").enqueue(bad)
    assert live_count() == 0


def test_a_site_codec__decodes_on_every_read_path(settings):
    settings.ALKSTORE = {**ROUTING, "PAYLOAD_CODEC": f"{__name__}.Reviving"}
    job_id = store.queue("c.q").enqueue_many([{"sent_at": WHEN}])[0]
    assert store.get_job(job_id).payload == {"sent_at": WHEN}
    assert store.queue("c.q").claim_one("w").job.payload == {"sent_at": WHEN}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("no.such.Codec", "cannot be loaded"),
        ("json.dumps", "has no encode/decode"),
        (3, "not a dotted path"),
    ],
)
def test_a_bad_codec_setting__is_a_system_check_error(settings, value, fragment):
    settings.ALKSTORE = {**ROUTING, "PAYLOAD_CODEC": value}
    [error] = [m for m in checks.check_settings() if m.id == "alkstore.E010"]
    assert fragment in error.msg
