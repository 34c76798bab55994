"""Contracts flow one way: the manager knows the protocol (and vitcg's declared extension), nothing more."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROTOCOL_SIDE = {"vitcg", "vitcg.budgets", "vitcg.engine", "vitcg.errors", "vitcg.extension", "vitcg.manager",
                 "vitcg.padding", "vitcg.protocol", "vitcg.syncs", "vitcg.timing"}


def imported_by(module: str) -> set[str]:
    code = (f"import sys, {module}; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('vitcg', 'transformers'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_manager_imports_only_the_protocol_side():
    loaded = imported_by("vitcg.manager")
    assert loaded <= PROTOCOL_SIDE, f"the manager pulls in {sorted(loaded - PROTOCOL_SIDE)}"
    assert not any(m.startswith("transformers") for m in loaded)


@pytest.mark.parametrize("module", ["vitcg.protocol", "vitcg.extension", "vitcg.engine"])
def test_contract_modules_stand_alone(module):
    loaded = imported_by(module)
    assert loaded <= {"vitcg", "vitcg.errors", "vitcg.protocol", module}, sorted(loaded)
