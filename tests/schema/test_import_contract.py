"""The import contract: every module has a layer, and no two modules import each other.

``lint-imports`` (run by ``scripts/test.sh``) checks the layers it is given;
these tests check what it cannot: that the layers name every module of the
package, and that the graph of run-time imports (function-level ones
included, ``TYPE_CHECKING`` ones not) has no cycle.
"""

from __future__ import annotations

import tomllib

import grimp
import pytest

from tests.helpers import ROOT

PACKAGE = "alkstore_django"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, exclude_type_checking_imports=True)


def main_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = config["tool"]["importlinter"]["contracts"][0]
    return [
        name.strip() for layer in contract["layers"] for name in layer.replace("|", ":").split(":")
    ]


def test_the_layers__name_every_module_of_the_package(graph):
    layers = main_layers()
    # A wing's __init__ only names what the wing offers (lazily or by re-export).
    wings = {f"{PACKAGE}.{wing}" for wing in ("tasks",)}
    unnamed = sorted(
        module
        for module in graph.modules
        if module != PACKAGE
        and module not in wings
        and not module.startswith(f"{PACKAGE}.migrations")
        and not any(module == layer or module.startswith(f"{layer}.") for layer in layers)
    )
    assert unnamed == []


def test_no_two_modules_import_each_other_at_run_time(graph):
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(imported, module):
                cycles.append((*graph.find_shortest_chain(imported, module), imported))
    assert cycles == []
