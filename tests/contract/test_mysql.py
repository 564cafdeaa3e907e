"""The dialect contract on MariaDB/MySQL, and what only this engine does.

See ``tests/contract/mixin.py`` for the contract. Below it: lock conflicts are
retried, the watcher polls and reconnects, and names compare exactly because
migration 0006 gave the tables a binary, no-pad collation.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from alkstore_django import store
from alkstore_django.dialects import dialect_for
from alkstore_django.models import Job
from alkstore_django.notify import open_watcher
from tests.contract.mixin import DialectContract
from tests.helpers import mysql_only, row_locked_elsewhere, wait_for

pytestmark = mysql_only("the MariaDB/MySQL dialect's contract run")


class TestMysqlDialect(DialectContract):
    vendor = "mysql"

    def test_ack__is_retried_after_a_lock_wait_timeout_not_surfaced(self, dialect):
        job_id = store.queue("c").enqueue({})
        job = dialect.claim("c", "w", 1)[0]
        try:
            with row_locked_elsewhere(job_id) as release:
                with connection.cursor() as cursor:
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
                # The first attempt waits 1 s and times out (1205); the holder lets
                # go meanwhile, and the retry acks.
                threading.Timer(1.5, release.set).start()
                assert dialect.ack_fenced("w", [(job_id, job.generation)]) == [job_id]
        finally:
            connection.close()
        assert not Job.objects.filter(id=job_id).exists()

    def test_lock_wait_timeout__inside_the_callers_transaction_is_the_callers(self, dialect):
        job_id = store.queue("c").enqueue({})
        job = dialect.claim("c", "w", 1)[0]
        try:
            with row_locked_elsewhere(job_id):
                with connection.cursor() as cursor:
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
                from django.db import OperationalError

                with pytest.raises(OperationalError), transaction.atomic():
                    dialect.ack_fenced("w", [(job_id, job.generation)])
        finally:
            connection.close()

    def test_watcher__reconnects_after_its_connection_is_killed_and_still_wakes(self, dialect):
        watcher = open_watcher(store, [], queues=["w"])
        try:
            assert watcher.wait(0.1) is False
            with connection.cursor() as cursor:
                cursor.execute("KILL CONNECTION %s", [watcher._conn.thread_id()])
            assert wait_for(lambda: watcher.wait(0.2), timeout=5)  # the reconnect's wake-up
            assert watcher.reconnects == 1
            store.queue("w").enqueue({})
            assert watcher.wait(5.0) is True
        finally:
            watcher.close()

    def test_server_problem__none_for_this_server(self):
        assert dialect_for(connection.alias).server_problem() is None
