"""The removal helper: nothing outside the given roots is ever deleted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crishim.host.remove import OutsideRoots, confined, remove


@pytest.fixture()
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    (root / "images" / "layers" / "a" / "sub").mkdir(parents=True)
    (root / "images" / "layers" / "a" / "sub" / "f").write_text("x")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "canary").write_text("keep")
    return root, victim


def test_removes_a_tree_under_the_root(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    remove(str(root / "images" / "layers" / "a"), [str(root / "images")])
    assert list((root / "images" / "layers").iterdir()) == []
    remove(str(root / "images" / "layers" / "missing"), [str(root / "images")])  # no error


@pytest.mark.parametrize("rel", ["../victim", "images/../../victim",
                                 "images/layers/../../../victim"])
def test_dotdot_out_of_the_root_is_refused(tree: tuple[Path, Path], rel: str) -> None:
    root, victim = tree
    with pytest.raises(OutsideRoots):
        remove(str(root / rel), [str(root / "images")])
    assert (victim / "canary").read_text() == "keep"


def test_absolute_path_elsewhere_and_the_root_itself_are_refused(
        tree: tuple[Path, Path]) -> None:
    root, victim = tree
    for path in (str(victim), "/", str(root / "images"), str(root / "images") + "/",
                 str(root / "images" / "."), ""):
        with pytest.raises(OutsideRoots):
            remove(path, [str(root / "images")])
    assert (victim / "canary").read_text() == "keep"
    assert (root / "images" / "layers" / "a" / "sub" / "f").exists()


def test_a_symlinked_parent_is_resolved_before_the_check(tree: tuple[Path, Path]) -> None:
    root, victim = tree
    os.symlink(victim, root / "images" / "layers" / "link")
    with pytest.raises(OutsideRoots):
        remove(str(root / "images" / "layers" / "link" / "canary"), [str(root / "images")])
    assert (victim / "canary").read_text() == "keep"


def test_a_symlink_itself_is_unlinked_not_followed(tree: tuple[Path, Path]) -> None:
    root, victim = tree
    link = root / "images" / "layers" / "b"
    os.symlink(victim, link)
    remove(str(link), [str(root / "images")])
    assert not os.path.lexists(link)
    assert (victim / "canary").read_text() == "keep"


def test_any_of_several_roots(tree: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = tree
    state = tmp_path / "state"
    (state / "x").mkdir(parents=True)
    remove(str(state / "x"), [str(root), str(state)])
    assert not (state / "x").exists()
    # A sibling sharing the root's name as a prefix is not below it.
    (tmp_path / "state2").mkdir()
    with pytest.raises(OutsideRoots):
        confined(str(tmp_path / "state2"), [str(state)])
