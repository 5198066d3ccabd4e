"""hack/mutants.py stays applicable: every entry's text is still in its file exactly once
(a refactor that moves it makes the entry stale: update it with the code), its test
selections exist, and names are unique. Whether each mutant is caught is what
`hack/test.sh mutants` runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crishim_mutants", REPO / "hack" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


MUTANTS = load().MUTANTS


def test_names_are_unique_and_the_list_is_not_empty() -> None:
    names = [m.name for m in MUTANTS]
    assert names and len(names) == len(set(names))


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_each_entry_applies_to_the_code(m: Any) -> None:
    text = (REPO / m.path).read_text()
    assert text.count(m.old) == 1, \
        f"{m.name}: its text is in {m.path} {text.count(m.old)} times, not once: " \
        "update the entry in hack/mutants.py"
    assert m.new != m.old
    for t in m.tests:
        assert (REPO / t.split("::")[0]).is_file(), f"{m.name}: no test file {t}"
