"""The chaos suite's switches and fixtures.

By default every scenario runs in a short, bounded form inside the normal test
command. ``--chaos-long`` (declared in tests/conftest.py) or
``ALKSTORE_CHAOS_LONG=1`` turns each into a longer soak: more jobs, more
faults, longer timeouts. The figures of every scenario are printed at the
end of the run and written to ``.test-db/chaos-figures-<engine>.json`` for
docs/reliability.md.
"""

from __future__ import annotations

import json
import os

import pytest
from django import get_version

pytest.register_assert_rewrite("tests.chaos.harness")

from tests.chaos.harness import Figures, Fleet, chaos_long_enabled  # noqa: E402
from tests.helpers import ROOT, VENDOR  # noqa: E402

LONG_TIMEOUT_S = 1800
FIGURES: list[dict[str, object]] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not chaos_long_enabled(config):
        return
    for item in items:
        if item.get_closest_marker("chaos") is not None:
            # Placed first, so it is the closest timeout marker.
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S), append=False)


@pytest.fixture
def chaos_long(request: pytest.FixtureRequest) -> bool:
    """True when the scenarios should soak (``--chaos-long``)."""
    return chaos_long_enabled(request.config)


@pytest.fixture
def fleet(subprocess_env: dict[str, str], tmp_path) -> Fleet:
    """The scenario's processes; none outlives the test."""
    crew = Fleet(subprocess_env, tmp_path)
    yield crew
    crew.cleanup()


@pytest.fixture
def report():
    """Record a scenario's figures for the end-of-run table; fail on any problem found."""

    def add(figures: Figures) -> Figures:
        FIGURES.append(figures.as_dict())
        return figures

    return add


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not FIGURES:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"chaos figures ({VENDOR}, Django {get_version()})")
    header = "scenario                     enq  acked  dead  lost  double  kills  restarts   secs"
    write(header)
    for row in FIGURES:
        write(
            f"{str(row['scenario'])[:27]:27} {row['enqueued']:5} {row['acked']:6} "
            f"{row['dead']:5} {row['lost']:5} {row['double_run']:7} {row['kills']:6} "
            f"{row['restarts']:9} {row['seconds']:6.1f}"
        )
    out = ROOT / ".test-db" / f"chaos-figures-{VENDOR}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "engine": VENDOR,
        "django": get_version(),
        "long": chaos_long_enabled(config),
        "pid": os.getpid(),
        "scenarios": FIGURES,
    }
    out.write_text(json.dumps(payload, indent=2, default=str))
