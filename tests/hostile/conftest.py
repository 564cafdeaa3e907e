"""Keep Hypothesis's caches out of the repository root (they go under .test-db/)."""

from __future__ import annotations

from hypothesis.configuration import set_hypothesis_home_dir

from tests.helpers import ROOT


def pytest_configure(config) -> None:
    set_hypothesis_home_dir(ROOT / ".test-db" / "hypothesis")
