"""Query strings no stored value can match: a 200 or a clear 400, never a 500 (issue 12, 14)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from alkstore_django import store
from tests.factories import DeadJobFactory

pytestmark = pytest.mark.django_db

CHANGELISTS = ["deadjob", "job", "taskresult", "schedule", "lock"]
SEARCHABLE = ["deadjob", "job", "taskresult"]


def changelist(model: str) -> str:
    return reverse(f"admin:alkstore_django_{model}_changelist")


@pytest.mark.parametrize("model", SEARCHABLE)
@pytest.mark.parametrize("term", ["²", "①", "١٢", " 7 ", str(2**63)])
def test_search__digits_int_cannot_read_match_text_only(admin_client, model, term):
    # str.isdigit() is true for "²", "①" and Arabic-Indic digits; int() refuses the first two.
    response = admin_client.get(changelist(model), {"q": term})
    assert response.status_code == 200


def test_search__an_ascii_number_still_finds_the_id(admin_client):
    dead = DeadJobFactory()
    job_id = store.queue("h.q").enqueue(1)
    found = admin_client.get(changelist("deadjob"), {"q": f" {dead.id} "})
    assert [d.id for d in found.context["cl"].result_list] == [dead.id]
    found = admin_client.get(changelist("job"), {"q": str(job_id)})
    assert [j.id for j in found.context["cl"].result_list] == [job_id]


@pytest.mark.parametrize("model", CHANGELISTS)
@pytest.mark.parametrize("param", ["queue", "q", "state", "x\x00"])
def test_nul_in_a_query_parameter__is_a_400_naming_it(admin_client, model, param):
    response = admin_client.get(changelist(model), {param: "a\x00b"})
    assert response.status_code == 400
    assert response.content.decode() == (
        f"Invalid query parameter {param!r}: a NUL character matches no stored value; "
        "remove it from the address."
    )
