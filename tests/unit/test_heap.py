"""crishim/proc/heap.py: start-up objects leave the collector's sight, later garbage does not."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from crishim.proc import heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def frozen() -> Iterator[int]:
    try:
        yield heap.freeze_startup_objects()
    finally:
        gc.unfreeze()


def test_startup_objects_are_frozen_and_later_cycles_still_collected(frozen: int) -> None:
    assert frozen > 1000 and gc.get_freeze_count() > 1000  # modules, classes, functions
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_a_full_collection_walks_only_what_came_later(frozen: int) -> None:
    assert len(gc.get_objects(generation=2)) < frozen / 10
