"""Run Django's own tests/tasks against AlkstoreBackend.

Django's sdist (from PyPI, for the installed version) carries its test suite;
this script downloads it once into ``.test-db/``, extracts ``tests/tasks`` as a
top-level ``tasks`` package (Django's tests expect ``tasks.tasks.noop_task``),
re-targets the backend-generic classes at alkstore through class-level
``override_settings`` and runs them with Django's test runner. Nothing of
Django's test code is copied into this repository.

    python tests/django_tasks_suite/run.py [--json PATH] [-v 2]

Exit codes: 0 all applicable tests passed, 1 failures, 77 the sdist could not
be downloaded (the pytest wrapper skips then).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".test-db" / "django-sdist"
EXIT_UNAVAILABLE = 77

SUITE = "tests.django_tasks_suite.backends.SuiteBackend"
IMMEDIATE = "tests.django_tasks_suite.backends.SuiteImmediateBackend"

# Django class → the TASKS it runs under here. Every alias Django's class
# configures is kept; the DummyBackend/ImmediateBackend ones become alkstore.
ADAPTED = {
    "tasks.test_tasks.TaskTestCase": {
        "default": {"BACKEND": SUITE, "QUEUES": ["default", "queue_1"]},
        "immediate": {"BACKEND": IMMEDIATE, "QUEUES": []},
        "missing": {"BACKEND": "does.not.exist"},
    },
    "tasks.test_dummy_backend.DummyBackendTestCase": {"default": {"BACKEND": SUITE, "QUEUES": []}},
    "tasks.test_dummy_backend.DummyBackendTransactionTestCase": {
        "default": {"BACKEND": SUITE, "QUEUES": []}
    },
    "tasks.test_immediate_backend.ImmediateBackendTestCase": {
        "default": {"BACKEND": IMMEDIATE, "QUEUES": []}
    },
    "tasks.test_immediate_backend.ImmediateBackendTransactionTestCase": {
        "default": {"BACKEND": IMMEDIATE, "QUEUES": []}
    },
}
# Run as Django ships them: they test Django's BaseTaskBackend with their own
# custom backends, and only need our task module to coexist. Each maps to the
# first Django that ships it (6.1 added task classes taking @task options).
UNCHANGED = {
    "tasks.test_custom_backend.CustomBackendTestCase": (6, 0),
    "tasks.test_custom_backend.CustomTaskTestCase": (6, 1),
}

_CLASS_CHECK = "asserts the backend is an instance of Django's {} class"
_SYNC_IN_ASYNC = (
    "calls the synchronous get_result() inside an async test; Django refuses a database "
    "query there (SynchronousOnlyOperation), so a database-backed backend cannot pass it. "
    "The async half (aget_result) runs in test_get_result_async"
)
_RESULTS_IN_ASYNC = (
    "reads the DummyBackend's in-memory backend.results synchronously inside an async "
    "test; for a database-backed backend that is a query Django refuses there "
    "(SynchronousOnlyOperation). aenqueue itself is covered by test_get_result_async and "
    "ImmediateBackendTestCase.test_enqueue_task_async"
)
_REFRESH_IN_ASYNC = (
    "calls the synchronous refresh() inside an async test (SynchronousOnlyOperation for a "
    "database-backed backend); sync refresh: tests/tasks/test_results.py"
)
_METHOD_OVERRIDE = (
    "its method-level override_settings switches TASKS back to Django's {} backend, so "
    "it would test Django's backend, not alkstore's; alkstore's own test covers it: {}"
)
NOT_APPLICABLE = {
    "tasks.test_tasks.TaskTestCase.test_using_correct_backend": _CLASS_CHECK.format("DummyBackend"),
    "tasks.test_tasks.TaskTestCase.test_get_backend": _CLASS_CHECK.format(
        "DummyBackend/ImmediateBackend"
    ),
    "tasks.test_tasks.TaskTestCase.test_get_missing_result": _SYNC_IN_ASYNC,
    "tasks.test_tasks.TaskTestCase.test_enqueue_task_async": _RESULTS_IN_ASYNC,
    "tasks.test_tasks.TaskTestCase.test_refresh_result": _REFRESH_IN_ASYNC,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_enqueue_task_async": _RESULTS_IN_ASYNC,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_using_correct_backend": (
        _CLASS_CHECK.format("DummyBackend")
    ),
    "tasks.test_dummy_backend.DummyBackendTestCase.test_get_missing_result": _SYNC_IN_ASYNC,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result": (
        "fakes progress by mutating the DummyBackend's in-memory result objects; alkstore "
        "results live in the database (refresh against real progress: "
        "tests/tasks/test_results.py::test_run__successful_with_the_return_value)"
    ),
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": (
        "fakes progress by mutating the DummyBackend's in-memory result objects"
    ),
    "tasks.test_dummy_backend.DummyBackendTestCase.test_validate_on_enqueue": (
        _METHOD_OVERRIDE.format("Dummy", "TaskTestCase.test_unknown_queue_name")
    ),
    "tasks.test_dummy_backend.DummyBackendTestCase.test_validate_on_aenqueue": (
        _METHOD_OVERRIDE.format("Dummy", "TaskTestCase.test_unknown_queue_name")
    ),
    "tasks.test_dummy_backend.DummyBackendTransactionTestCase."
    "test_doesnt_wait_until_transaction_commit_by_default": _METHOD_OVERRIDE.format(
        "Dummy", "test_results.py::test_enqueue__joins_the_callers_transaction"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_using_correct_backend": (
        _CLASS_CHECK.format("ImmediateBackend")
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": (
        "asserts get_result() raises NotImplementedError; alkstore supports results"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": (
        "asserts refresh() raises NotImplementedError; alkstore supports results"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
        "asserts run_after is refused; alkstore supports run_after (supports_defer)"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_validate_on_enqueue": (
        _METHOD_OVERRIDE.format("Immediate", "TaskTestCase.test_unknown_queue_name")
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_validate_on_aenqueue": (
        _METHOD_OVERRIDE.format("Immediate", "TaskTestCase.test_unknown_queue_name")
    ),
    "tasks.test_immediate_backend.ImmediateBackendTransactionTestCase."
    "test_doesnt_wait_until_transaction_commit_by_default": _METHOD_OVERRIDE.format(
        "Immediate", "test_results.py::test_enqueue__joins_the_callers_transaction"
    ),
}


def fetch_tests(version: str) -> Path:
    """Return a directory holding Django's ``tasks`` test package for ``version``."""
    target = CACHE / f"tests-{version}"
    if (target / "tasks" / "tasks.py").exists():
        return target
    sdist = CACHE / f"django-{version}.tar.gz"
    if not sdist.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", f"django=={version}",
            "--no-binary", ":all:", "--no-deps", "--quiet", "-d", str(CACHE),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not sdist.exists():
            raise FileNotFoundError(done.stderr.strip() or f"pip did not produce {sdist}")
    prefix = f"django-{version}/tests/tasks/"
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if member.name.startswith(prefix) and member.isfile():
                member.name = "tasks/" + member.name[len(prefix) :]
                archive.extract(member, target, filter="data")
    return target


def build_suite() -> tuple[unittest.TestSuite, dict[str, str]]:
    """Return the adapted suite and which group each test id belongs to."""
    import django
    from django.test import TestCase, TransactionTestCase, override_settings
    from django.utils.module_loading import import_string

    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    groups: dict[str, str] = {}
    for path, tasks_setting in ADAPTED.items():
        original = import_string(path)
        attrs: dict[str, object] = {"__module__": original.__module__, "databases": {"default"}}
        if issubclass(original, TransactionTestCase):
            bases: tuple[type, ...] = (original,)
            attrs["available_apps"] = None  # flush every table, ours included
        else:
            # SimpleTestCase → TestCase: the backend needs the database, in a rollback.
            bases = (TestCase, original)
        adapted = type(original.__name__, bases, attrs)
        adapted.__qualname__ = original.__qualname__
        for name in loader.getTestCaseNames(original):
            reason = NOT_APPLICABLE.get(f"{path}.{name}")
            if reason:
                setattr(adapted, name, unittest.skip(reason)(getattr(original, name)))
        adapted = override_settings(TASKS=tasks_setting)(adapted)
        for test in loader.loadTestsFromTestCase(adapted):
            groups[test.id()] = "adapted"
            suite.addTest(test)
    for path, since in UNCHANGED.items():
        if django.VERSION[:2] < since:
            continue
        for test in loader.loadTestsFromTestCase(import_string(path)):
            groups[test.id()] = "unchanged"
            suite.addTest(test)
    return suite, groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the counts here")
    parser.add_argument("-v", "--verbosity", type=int, default=1)
    options = parser.parse_args(argv)

    import django

    version = django.__version__
    if django.VERSION < (6, 0):
        sys.stderr.write(f"Django {version} has no Tasks framework.\n")
        return EXIT_UNAVAILABLE
    try:
        tests_dir = fetch_tests(version)
    except (OSError, tarfile.TarError) as exc:
        sys.stderr.write(f"Django {version}'s sdist is unavailable: {exc}\n")
        return EXIT_UNAVAILABLE
    sys.path[:0] = [str(tests_dir), str(ROOT)]
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_tasks_suite.settings"
    django.setup()

    from django.test.runner import DiscoverRunner

    suite, groups = build_suite()
    runner = DiscoverRunner(verbosity=options.verbosity, interactive=False)
    runner.setup_test_environment()
    old_config = runner.setup_databases(aliases={"default"}, serialized_aliases=set())
    try:
        result = runner.run_suite(suite)
    finally:
        runner.teardown_databases(old_config)
        runner.teardown_test_environment()

    # A failing subtest is reported under its own id: count it against its test.
    bad = {getattr(test, "test_case", test).id() for test, _ in result.failures + result.errors}
    skipped = {test.id(): reason for test, reason in result.skipped}
    counts: dict[str, object] = {"django": version, "failed": sorted(bad)}
    for group in ("adapted", "unchanged"):
        ids = [i for i, g in groups.items() if g == group]
        counts[group] = {
            "total": len(ids),
            "passed": len([i for i in ids if i not in bad and i not in skipped]),
            "not_applicable": len([i for i in ids if i in skipped]),
        }
    counts["not_applicable"] = skipped
    if options.json:
        Path(options.json).write_text(json.dumps(counts, indent=2))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
