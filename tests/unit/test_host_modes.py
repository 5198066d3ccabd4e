"""host/modes.py: the modes of crishim's directories and the tightening of an old install."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from crishim.host import modes


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.mark.parametrize(("mode", "allowed", "want"), [
    (0o755, 0o700, 0o700),
    (0o711, 0o700, 0o700),
    (0o711, 0o710, 0o710),
    (0o700, 0o700, None),
    (0o500, 0o700, None),
    (0o666, 0o600, 0o600),
    (0o4755, 0o700, 0o700),  # a setuid bit goes too
    (0o040755, 0o711, 0o711),  # st_mode with the file type
])
def test_tightened_keeps_only_allowed_bits(mode: int, allowed: int, want: int | None) -> None:
    assert modes.tightened(mode, allowed) == want


def test_bundle_mode_is_private_or_the_pods_group() -> None:
    assert modes.bundle_mode(None) == 0o700
    assert modes.bundle_mode(0) == 0o700
    assert modes.bundle_mode(100000) == 0o710


def test_make_dir_sets_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        modes.make_dir(str(tmp_path / "a" / "b"), 0o755)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == 0o755
    assert _mode(tmp_path / "a" / "b") == 0o755


def test_make_dir_leaves_an_existing_dir_unless_given_a_group(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(0o755)
    modes.make_dir(str(d), 0o700)
    assert _mode(d) == 0o755
    if os.geteuid() == 0:
        modes.make_dir(str(d), 0o710, 4242)
        assert _mode(d) == 0o710
        assert os.stat(d).st_gid == 4242


def test_make_private_file_is_0600_and_keeps_content(tmp_path: Path) -> None:
    f = tmp_path / "termination-log"
    f.write_text("x")
    f.chmod(0o666)  # as made before
    modes.make_private_file(str(f))
    assert _mode(f) == 0o600
    assert f.read_text() == "x"


def test_tighten_install_makes_an_old_layout_private(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    old = os.umask(0o022)
    try:
        for d in ("containers/c1/rootfs", "sandboxes/s1/bundle", "pause/rootfs", "cni",
                  "images/layers"):
            (root / d).mkdir(parents=True)
        (root / "containers/c1/config.json").write_text("{}")
        (root / "sandboxes/s1/bundle/config.json").write_text("{}")
        (root / "crishim.db").write_text("")
        for d in ("conmon/c1", "exits", "netns"):
            (state / d).mkdir(parents=True)
        (state / "crishim.lock").write_text("")
    finally:
        os.umask(old)
    for p in (root, state, root / "containers", root / "containers/c1", root / "sandboxes/s1"):
        p.chmod(0o711 if p in (root, state) else 0o755)
    if os.geteuid() == 0:
        (root / "sandboxes/s2").mkdir()
        (root / "sandboxes/s2").chmod(0o711)
        os.chown(root / "sandboxes/s2", 0, 100000)  # a user-namespaced pod's, from before

    modes.tighten_install(str(root), str(state))
    modes.tighten_install(str(root), str(state))  # idempotent

    for p in (root, state, root / "containers", root / "sandboxes", root / "pause/rootfs"):
        assert _mode(p) == 0o711, p
    for p in (root / "containers/c1", root / "sandboxes/s1", root / "sandboxes/s1/bundle",
              root / "cni", root / "pause", state / "conmon", state / "exits",
              state / "netns"):
        assert _mode(p) == 0o700, p
    for p in (root / "containers/c1/config.json", root / "sandboxes/s1/bundle/config.json",
              root / "crishim.db", state / "crishim.lock"):
        assert _mode(p) == 0o600, p
    assert _mode(root / "images") == 0o755  # not this step's: image/ owns it
    if os.geteuid() == 0:
        assert _mode(root / "sandboxes/s2") == 0o710


def test_child_thread_has_its_own_umask() -> None:
    seen: list[int] = []

    def starter() -> None:
        modes.child_thread()
        seen.append(os.umask(modes.CHILD_UMASK))

    old = os.umask(0o077)
    try:
        t = threading.Thread(target=starter)
        t.start()
        t.join()
        assert seen == [modes.CHILD_UMASK]
        assert os.umask(0o077) == 0o077  # the process's is untouched
    finally:
        os.umask(old)
