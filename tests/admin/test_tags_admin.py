"""Tags in the admin: the tag filter, ``tag:`` search and the tags column on three lists."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from itertools import count

import pytest
from django.urls import reverse
from django.utils import timezone

from alkstore_django import store
from alkstore_django.admin.base import TAG_SAMPLE_ROWS
from alkstore_django.models import Job, JobResult
from alkstore_django.records import join_tags
from tests.factories import DeadJobFactory

pytestmark = pytest.mark.django_db

_result_ids = count(20_000_000)


def live(tags: list[str], error: str | None = None) -> int:
    job_id = store.queue("adm.tags").enqueue({}, tags=tags)
    if error is not None:
        Job.objects.filter(id=job_id).update(last_error=error)
    return job_id


def dead(tags: list[str], error: str | None = None) -> int:
    return DeadJobFactory(tags=join_tags(tags), last_error=error or "ValueError: x").id


def result(tags: list[str], error: str | None = None) -> int:
    now = timezone.now()
    row = JobResult.objects.create(
        job_id=next(_result_ids), queue="adm.tags", state="failed", attempts=1,
        error=error or "ValueError: x", finished_at=now, expires_at=now + timedelta(hours=1),
        tags=join_tags(tags),
    )  # fmt: skip
    return row.job_id


MAKERS: dict[str, Callable[..., int]] = {"job": live, "deadjob": dead, "jobresult": result}
LISTS = list(MAKERS)


def url(model: str) -> str:
    return reverse(f"admin:alkstore_django_{model}_changelist")


def tag_filters(response) -> list:
    specs = response.context["cl"].filter_specs
    return [s for s in specs if getattr(s, "parameter_name", None) == "tag"]


def found(client, model: str, **params: str) -> list[int]:
    response = client.get(url(model), params)
    assert response.status_code == 200
    return sorted(row.pk for row in response.context["cl"].result_list)


@pytest.mark.parametrize("model", LISTS)
def test_the_tag_filter__keeps_the_rows_with_that_whole_tag(admin_client, model):
    make = MAKERS[model]
    seven = make(["customer:7", "import"])
    seventy = make(["customer:70"])
    underscore = make(["a_b"])
    lookalike = make(["axb"])
    make([])
    assert found(admin_client, model, tag="customer:7") == [seven]
    assert found(admin_client, model, tag="import") == [seven]
    # LIKE's "_" is escaped: the tag a_b does not match axb.
    assert found(admin_client, model, tag="a_b") == [underscore]
    assert found(admin_client, model, tag="axb") == [lookalike]
    assert found(admin_client, model, tag="customer") == []
    assert seventy not in found(admin_client, model, tag="customer:7")


@pytest.mark.parametrize("model", LISTS)
def test_the_tag_filter__lists_the_recent_tags_and_keeps_a_chosen_one(admin_client, model):
    make = MAKERS[model]
    make(["customer:7", "import"])
    make(["export"])
    response = admin_client.get(url(model))
    (tag_filter,) = tag_filters(response)
    assert [value for value, _ in tag_filter.lookup_choices] == ["customer:7", "export", "import"]
    response = admin_client.get(url(model), {"tag": "never:used"})
    (tag_filter,) = tag_filters(response)
    assert "never:used" in [value for value, _ in tag_filter.lookup_choices]
    assert list(response.context["cl"].result_list) == []


@pytest.mark.parametrize("model", LISTS)
@pytest.mark.parametrize("bad", ["Customer:7", "a,b", "%", "_", "x" * 65, ""])
def test_a_value_no_tag_can_be__is_a_200_with_no_rows(admin_client, model, bad):
    MAKERS[model](["customer:7", "a", "b"])
    if bad == "Customer:7":
        # Tags are lowercase: an upper-case search term still finds the tag.
        assert len(found(admin_client, model, q=f"tag:{bad}")) == 1
        return
    assert found(admin_client, model, tag=bad) == []
    assert found(admin_client, model, q=f"tag:{bad}") == []


@pytest.mark.parametrize("model", LISTS)
def test_search__tag_terms_narrow_and_mix_with_text_and_ids(admin_client, model):
    make = MAKERS[model]
    both = make(["customer:7", "import"], error="TimeoutError: smtp")
    one = make(["customer:7"], error="KeyError: x")
    third = make(["import"], error="TimeoutError: smtp")
    assert found(admin_client, model, q="tag:customer:7") == [both, one]
    assert found(admin_client, model, q="tag:customer:7 tag:import") == [both]
    assert found(admin_client, model, q="tag:import smtp") == sorted([both, third])
    assert found(admin_client, model, q="tag:customer:7 smtp") == [both]
    assert found(admin_client, model, q=f"tag:customer:7 {one}") == [one]
    # A lone word that is a tag finds that tag's rows, beside the text matches.
    assert found(admin_client, model, q="import") == sorted([both, third])
    assert found(admin_client, model, q="customer") == []  # a tag matches whole, not a prefix


@pytest.mark.parametrize("model", LISTS)
def test_search__and_the_filter_combine(admin_client, model):
    make = MAKERS[model]
    both = make(["customer:7", "import"])
    make(["customer:7"])
    assert found(admin_client, model, tag="import", q="tag:customer:7") == [both]


@pytest.mark.parametrize("model", LISTS)
def test_the_tags_column__links_each_tag_to_its_filter(admin_client, model):
    job_id = MAKERS[model](["customer:7", "import"])
    html = admin_client.get(url(model)).content.decode()
    assert f'<a href="{url(model)}?tag=customer%3A7">customer:7</a>, ' in html
    assert f'<a href="{url(model)}?tag=import">import</a>' in html
    detail = reverse(f"admin:alkstore_django_{model}_change", args=[job_id])
    html = admin_client.get(detail).content.decode()
    assert f'<a href="{url(model)}?tag=import">import</a>' in html


def test_the_filter_choices__read_only_the_newest_rows(admin_client):
    old = dead(["old:tag"])
    for _ in range(TAG_SAMPLE_ROWS):
        dead([])
    response = admin_client.get(url("deadjob"))
    # No recent row has a tag: the filter has no choices and is not shown.
    assert tag_filters(response) == []
    # Still reachable by address and by search.
    assert found(admin_client, "deadjob", tag="old:tag") == [old]
    assert found(admin_client, "deadjob", q="tag:old:tag") == [old]
