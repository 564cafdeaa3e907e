"""The async API: each ``a``-method behaves as its sync twin, in and out of transactions.

Async code is driven as a site drives it: ``async_to_sync`` from a sync
caller (a test, a management command) or Django's ``AsyncClient`` against an
async view of this module's URLconf. No pytest-asyncio: the package does not
need it, so neither do its tests.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections, transaction
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient
from django.urls import path

from alkstore_django import Store, Workflow, store
from alkstore_django.errors import (
    AlkstoreError,
    DuplicateJob,
    InvalidArgument,
    InvalidWorkflow,
    PayloadError,
    StoreClosed,
)
from alkstore_django.models import Workflow as WorkflowRow
from alkstore_django.signals import job_enqueued
from alkstore_django.testing import run_ready_jobs
from tests.helpers import ALKSTORE_DB, live_count, servers_only, site_database
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


class Refused(Exception):
    """The failure after the writes that must roll them back."""


def errors_of(call, *args, **kwargs) -> tuple[type[BaseException], str] | None:
    """Return the type and text of what ``call(*args, **kwargs)`` raises (None if nothing)."""
    try:
        call(*args, **kwargs)
    except AlkstoreError as exc:
        return type(exc), str(exc)
    return None


# --- the twins behave as the sync calls -------------------------------------------------


def test_aenqueue__writes_the_job_enqueue_would_and_returns_its_id():
    queue = store.queue("a.enqueue", max_attempts=5)
    options = {"priority": 3, "delay_s": 60, "tags": ["customer:7"], "keep_result_s": 30}
    async_id = async_to_sync(queue.aenqueue)({"n": 1}, **options)
    sync_id = queue.enqueue({"n": 1}, **options)
    assert async_id < sync_id
    made, twin = store.get_job(async_id), store.get_job(sync_id)
    assert made.run_at - made.enqueued_at == timedelta(seconds=60)
    assert (made.payload, made.priority, made.max_attempts, made.tags) == (
        {"n": 1},
        3,
        5,
        ("customer:7",),
    )
    # Row for row what the sync call wrote, but for the id and the clock reads.
    unclocked = {"id": 0, "run_at": made.run_at, "enqueued_at": made.enqueued_at}
    assert replace(made, **unclocked) == replace(twin, **unclocked)


@pytest.mark.parametrize(
    ("payload", "options", "error"),
    [
        ({1, 2}, {}, PayloadError),
        ({"n": 1}, {"delay_s": -1}, InvalidArgument),
        ({"n": 1}, {"run_at": datetime(2030, 1, 1)}, InvalidArgument),  # naive
        ({"n": 1}, {"unique_for_s": 10}, InvalidArgument),  # no unique_key
        ({"n": 1}, {"tags": "one"}, InvalidArgument),
    ],
)
def test_aenqueue__refuses_what_enqueue_refuses_with_the_same_error_and_writes_nothing(
    payload, options, error
):
    queue = store.queue("a.refused")
    refused = errors_of(async_to_sync(queue.aenqueue), payload, **options)
    assert refused == errors_of(queue.enqueue, payload, **options)
    assert refused is not None and refused[0] is error
    assert live_count() == 0


def test_aenqueue__with_a_taken_unique_key_returns_the_holder_or_raises_as_enqueue():
    queue = store.queue("a.unique")
    holder = async_to_sync(queue.aenqueue)({}, unique_key="order:1")
    assert async_to_sync(queue.aenqueue)({}, unique_key="order:1") == holder
    with pytest.raises(DuplicateJob) as raised:
        async_to_sync(queue.aenqueue)({}, unique_key="order:1", on_duplicate="raise")
    assert raised.value.job_id == holder
    assert live_count("a.unique") == 1


def test_aenqueue_many__returns_the_ids_in_order_and_one_bad_payload_writes_none():
    queue = store.queue("a.many")
    ids = async_to_sync(queue.aenqueue_many)([{"n": n} for n in range(5)], priority=2)
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert [store.get_job(i).payload for i in ids] == [{"n": n} for n in range(5)]
    assert {store.get_job(i).priority for i in ids} == {2}
    bad = [{"n": 1}, {"n": float("nan")}]
    refused = errors_of(async_to_sync(queue.aenqueue_many), bad)
    assert refused == errors_of(queue.enqueue_many, bad)
    assert refused is not None and refused[0] is PayloadError
    assert errors_of(async_to_sync(queue.aenqueue_many), {"n": 1}) == errors_of(
        queue.enqueue_many, {"n": 1}
    )
    assert live_count("a.many") == 5


def test_aenqueue_many__with_unique_keys_answers_as_enqueue_many():
    queue = store.queue("a.many_unique")
    first = async_to_sync(queue.aenqueue_many)([1, 2], unique_keys=["a", "b"])
    again = async_to_sync(queue.aenqueue_many)([1, 2, 3], unique_keys=["a", "b", "c"])
    assert again[:2] == first and again[2] not in first
    assert live_count("a.many_unique") == 3


def test_aget_job__reads_what_get_job_reads_and_refuses_a_bad_id_alike():
    job_id = store.queue("a.read").enqueue({"n": 1})
    assert async_to_sync(store.aget_job)(job_id) == store.get_job(job_id)
    assert async_to_sync(store.aget_job)(job_id + 1000) is None
    refused = errors_of(async_to_sync(store.aget_job), "1")
    assert refused == errors_of(store.get_job, "1")
    assert refused is not None and refused[0] is InvalidArgument


def test_acancel_job__cancels_a_pending_job_then_answers_false():
    job_id = store.queue("a.cancel").enqueue({})
    assert async_to_sync(store.acancel_job)(job_id) is True
    assert store.get_job(job_id) is None
    assert async_to_sync(store.acancel_job)(job_id) is False


def test_aget_result__reads_the_kept_result_as_get_result():
    job_id = store.queue("t.record").enqueue({}, keep_result_s=60)
    assert async_to_sync(store.aget_result)(job_id) is None  # live: no result yet
    run_ready_jobs(["t.record"])
    result = async_to_sync(store.aget_result)(job_id)
    assert result == store.get_result(job_id)
    assert (result.state, result.value) == ("succeeded", {"ok": job_id})
    assert errors_of(async_to_sync(store.aget_result), True) == errors_of(store.get_result, True)


def a_workflow() -> Workflow:
    wf = Workflow("async")
    wf.add("a", queue="a.wf", payload={"step": "a"})
    wf.add("b", queue="a.wf", after=["a"])
    return wf


def test_workflow_twins__enqueue_read_list_and_cancel_as_the_sync_calls():
    workflow_id = async_to_sync(store.aenqueue_workflow)(a_workflow())
    read = async_to_sync(store.aget_workflow)(workflow_id)
    assert read == store.get_workflow(workflow_id)
    assert {name: step.state for name, step in read.steps.items()} == {
        "a": "pending",
        "b": "waiting",
    }
    listed = async_to_sync(store.alist_workflows)(state="running", limit=5)
    assert listed == store.list_workflows(state="running", limit=5)
    assert [w.id for w in listed] == [workflow_id]
    assert async_to_sync(store.acancel_workflow)(workflow_id) is True
    assert store.get_workflow(workflow_id).state == "cancelled"
    assert async_to_sync(store.acancel_workflow)(workflow_id) is False
    assert async_to_sync(store.aget_workflow)(workflow_id + 1000) is None


def test_workflow_twins__refuse_what_the_sync_calls_refuse_and_write_nothing():
    cyclic = Workflow("cycle")
    cyclic.add("a", queue="a.wf", after=["b"])
    cyclic.add("b", queue="a.wf", after=["a"])
    for bad in (cyclic, "not a workflow"):
        refused = errors_of(async_to_sync(store.aenqueue_workflow), bad)
        assert refused == errors_of(store.enqueue_workflow, bad)
        assert refused is not None and refused[0] is InvalidWorkflow
    assert errors_of(async_to_sync(store.alist_workflows), state="nope") == errors_of(
        store.list_workflows, state="nope"
    )
    assert not WorkflowRow.objects.exists()
    assert live_count() == 0


def test_async_twins__of_a_closed_store_raise_store_closed():
    closed = Store(ALKSTORE_DB)
    closed.close()
    with pytest.raises(StoreClosed):
        async_to_sync(closed.aget_job)(1)
    queue = Store(ALKSTORE_DB).queue("a.closed")
    queue.store.close()
    with pytest.raises(StoreClosed):
        async_to_sync(queue.aenqueue)({})
    assert live_count() == 0


# --- transactions -------------------------------------------------------------------------


def test_atomic_in_a_coroutine__is_refused_by_django():
    # Why the docs send async code to a sync function for a transaction.
    async def view_code() -> None:
        with transaction.atomic(using=ALKSTORE_DB):
            pass

    with pytest.raises(SynchronousOnlyOperation):
        async_to_sync(view_code)()


def test_enqueue_in_a_coroutine__is_refused_as_django_refuses_a_query_there():
    # The sync enqueue would block the event loop on the database: Django's
    # guard stands, with the thread's connection already open or not.
    queue = store.queue("a.sync_in_async")
    queue.enqueue({"warm": True})  # this thread's connection is open

    async def view_code() -> None:
        queue.enqueue({"n": 1})

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(view_code())
    connections[ALKSTORE_DB].close()
    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(view_code())
    assert live_count() == 1


def place_order(reference: str, *, refuse: bool = False) -> int:
    """The documented pattern: one sync function, its writes and the enqueue in one atomic block."""
    with transaction.atomic(using=ALKSTORE_DB):
        order = Order.objects.create(reference=reference)
        job_id = store.queue("a.orders").enqueue({"order": order.pk})
        if refuse:
            raise Refused(reference)
    return job_id


def test_a_sync_function_in_atomic_through_sync_to_async__commits_the_job_with_its_writes():
    async def view_code() -> int:
        return await sync_to_async(place_order)("kept")

    job_id = async_to_sync(view_code)()
    order = Order.objects.get(reference="kept")
    assert store.get_job(job_id).payload == {"order": order.pk}


@site_database("the job rolls back with a site row")
def test_a_sync_function_in_atomic_through_sync_to_async__that_raises_writes_nothing():
    async def view_code() -> None:
        await sync_to_async(place_order)("dropped", refuse=True)

    with pytest.raises(Refused):
        async_to_sync(view_code)()
    assert not Order.objects.exists()
    assert live_count() == 0


def test_aenqueue_awaited_below_async_to_sync__joins_the_callers_atomic_block():
    # Sync code in atomic() that calls async code through async_to_sync: the
    # thread-sensitive call runs on the caller's thread, in its transaction.
    async def notify_customer(order_pk: int) -> int:
        return await store.queue("a.orders").aenqueue({"order": order_pk})

    with pytest.raises(Refused), transaction.atomic(using=ALKSTORE_DB):
        order = Order.objects.create(reference="rolled back")
        job_id = async_to_sync(notify_customer)(order.pk)
        assert store.get_job(job_id) is not None  # visible inside the transaction
        raise Refused
    assert store.get_job(job_id) is None
    assert live_count() == 0

    with transaction.atomic(using=ALKSTORE_DB):
        order = Order.objects.create(reference="committed")
        job_id = async_to_sync(notify_customer)(order.pk)
    assert store.get_job(job_id).payload == {"order": order.pk}


def test_aenqueue_outside_atomic__commits_at_once_as_enqueue():
    job_id = async_to_sync(store.queue("a.autocommit").aenqueue)({})
    seen: list[object] = []

    def other_session() -> None:
        # Another thread is another connection: it sees only committed rows.
        try:
            seen.append(store.get_job(job_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_session)
    thread.start()
    thread.join()
    assert seen and seen[0] is not None


async def enqueue_and_close() -> int:
    """Enqueue, then close the connections of the thread the enqueue ran on."""
    try:
        return await store.queue("a.threads").aenqueue({})
    finally:
        # Under asyncio.run that is asgiref's shared thread: nothing else closes them.
        await sync_to_async(connections.close_all)()


def test_aenqueue__runs_on_the_callers_thread_below_async_to_sync_and_elsewhere_under_asyncio_run():
    # Which thread (so which connection, so which transaction) the sync call gets.
    threads: list[int] = []

    def seen(sender, **kwargs) -> None:
        threads.append(threading.get_ident())

    job_enqueued.connect(seen)
    try:
        async_to_sync(enqueue_and_close)()
        asyncio.run(enqueue_and_close())
    finally:
        job_enqueued.disconnect(seen)
    assert threads[0] == threading.get_ident()
    assert threads[1] != threading.get_ident()
    assert live_count("a.threads") == 2


@servers_only("SQLite's one writer: the test's atomic block holds the lock the other waits on")
def test_aenqueue_under_asyncio_run__does_not_join_the_callers_atomic_block():
    # asgiref's shared thread is another connection: its enqueue commits on its own.
    with pytest.raises(Refused), transaction.atomic(using=ALKSTORE_DB):
        job_id = asyncio.run(enqueue_and_close())
        raise Refused
    assert store.get_job(job_id) is not None


# --- from an async view -----------------------------------------------------------------


async def enqueue_view(request: HttpRequest) -> JsonResponse:
    job_id = await store.queue("a.view").aenqueue({"ref": request.GET["ref"]})
    return JsonResponse({"id": job_id, "job": (await store.aget_job(job_id)).payload})


async def order_view(request: HttpRequest) -> JsonResponse:
    try:
        job_id = await sync_to_async(place_order)(
            request.GET["ref"], refuse="refuse" in request.GET
        )
    except Refused:
        return JsonResponse({"refused": True}, status=409)
    return JsonResponse({"id": job_id})


urlpatterns = [path("enqueue", enqueue_view), path("order", order_view)]


@pytest.mark.urls(__name__)
def test_an_async_view__enqueues_with_aenqueue_and_reads_the_job_back():
    response = async_to_sync(AsyncClient().get)("/enqueue", {"ref": "r-1"})
    assert response.status_code == 200
    body = response.json()
    assert body["job"] == {"ref": "r-1"}
    assert store.get_job(body["id"]).payload == {"ref": "r-1"}


@site_database("the job commits with a site row")
@pytest.mark.urls(__name__)
def test_an_async_view__enqueues_atomically_with_its_writes_through_sync_to_async():
    client = AsyncClient()
    kept = async_to_sync(client.get)("/order", {"ref": "kept"})
    assert kept.status_code == 200
    assert store.get_job(kept.json()["id"]).payload == {"order": Order.objects.get().pk}
    refused = async_to_sync(client.get)("/order", {"ref": "dropped", "refuse": "1"})
    assert refused.status_code == 409
    assert list(Order.objects.values_list("reference", flat=True)) == ["kept"]
    assert live_count("a.orders") == 1
