"""The mount points and short links a rootfs mount makes inside its bundle are removed
only below that bundle (host/remove.py): a symlink planted at <bundle>/m or <bundle>/l
that points at a host directory is refused, and nothing there is removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crishim.host.remove import OutsideRoots
from crishim.image import rootfs


def _victim(base: Path) -> Path:
    victim = base / "victim"
    (victim / "0").mkdir(parents=True)
    (victim / "1").write_text("keep")
    return victim


def _intact(victim: Path) -> bool:
    return (victim / "0").is_dir() and (victim / "1").read_text() == "keep"


def test_idmapped_layer_mount_points_are_removed_only_below_the_bundle(
        tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    bundle = tmp_path / "containers" / "c"
    bundle.mkdir(parents=True)
    (bundle / "m").symlink_to(victim)
    with pytest.raises(OutsideRoots):
        rootfs._detach_all([str(bundle / "m" / "0")], str(bundle))
    with pytest.raises(OutsideRoots):
        rootfs._detach_all([str(bundle / ".." / ".." / "victim" / "0")], str(bundle))
    assert _intact(victim)
    # Its own (unmounted, empty) mount points go.
    (bundle / "m").unlink()
    (bundle / "m" / "0").mkdir(parents=True)
    rootfs._detach_all([str(bundle / "m" / "0")], str(bundle))
    assert not (bundle / "m" / "0").exists()


def test_short_links_are_replaced_only_below_the_bundle(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("0", "1"):  # host files named like the links
        (victim / name).write_text("keep")
    bundle = tmp_path / "containers" / "c"
    bundle.mkdir(parents=True)
    (bundle / "l").symlink_to(victim)
    with pytest.raises(OutsideRoots):
        rootfs._short_links(["/layers/a", "/layers/b"], str(bundle / "l"))
    assert all((victim / n).read_text() == "keep" for n in ("0", "1"))
    (bundle / "l").unlink()
    links = rootfs._short_links(["/layers/a", "/layers/b"], str(bundle / "l"))
    assert [os.readlink(p) for p in links] == ["/layers/a", "/layers/b"]
    # Made again (a retried create): the old links are replaced.
    links = rootfs._short_links(["/layers/c"], str(bundle / "l"))
    assert os.readlink(links[0]) == "/layers/c"
