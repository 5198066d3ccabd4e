"""The image store's layout: private dirs, names from parsed digests only, and layer dirs
that count only with crishim's own verified marker."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from crishim.host.remove import OutsideRoots
from crishim.image import digest
from crishim.image.store import KIND, Metadata, Paths
from crishim.store.db import Database

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


def make_layer(paths: Paths, diff_id: str, marked: bool) -> Path:
    d = Path(paths.layer(diff_id))
    d.mkdir()
    (d / "f").write_text("x")
    if marked:
        paths.mark_verified(diff_id)
    return d


def test_dirs_are_private_even_in_an_older_store(tmp_path: Path) -> None:
    old = tmp_path / "images" / "layers"
    old.mkdir(parents=True, mode=0o711)
    os.chmod(old, 0o711)
    paths = Paths(str(tmp_path))
    assert paths.ensure() is True  # no markers dir yet
    for d in (paths.base, os.path.dirname(paths.blobs), paths.blobs, paths.layers,
              paths.tmp, paths.verified):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert paths.ensure() is False


@pytest.mark.parametrize("bad", ["sha256:../../etc", "sha256:/", "sha256:" + "A" * 64,
                                 "sha256:" + "a" * 63, "md5:" + "a" * 32])
def test_paths_come_only_from_valid_digests(tmp_path: Path, bad: str) -> None:
    paths = Paths(str(tmp_path))
    for build in (paths.layer, paths.blob, paths.marker):
        with pytest.raises(digest.BadDigest):
            build(bad)


def test_a_layer_counts_only_with_its_marker(tmp_path: Path) -> None:
    paths = Paths(str(tmp_path))
    paths.ensure()
    make_layer(paths, A, marked=False)
    assert not paths.layer_ready(A)
    paths.mark_verified(A)
    assert paths.layer_ready(A)
    Path(paths.marker(B)).write_text(B)  # a marker without its dir is not a layer either
    assert not paths.layer_ready(B)


def test_sweep_removes_unmarked_dirs_and_stray_markers(tmp_path: Path) -> None:
    paths = Paths(str(tmp_path))
    paths.ensure()
    kept = make_layer(paths, A, marked=True)
    planted = make_layer(paths, B, marked=False)
    odd = Path(paths.layers, "not-a-digest")
    odd.mkdir()
    Path(paths.marker("sha256:" + "c" * 64)).write_text("x")
    assert paths.sweep_layers() == 2
    assert sorted(os.listdir(paths.layers)) == [kept.name]
    assert sorted(os.listdir(paths.verified)) == [kept.name]
    assert not planted.exists() and not odd.exists()


def test_sweep_adopts_recorded_layers_of_a_store_before_markers(tmp_path: Path) -> None:
    paths = Paths(str(tmp_path))
    paths.ensure()
    make_layer(paths, A, marked=False)
    make_layer(paths, B, marked=False)
    assert paths.sweep_layers(adopt=[A]) == 1
    assert paths.layer_ready(A) and not os.path.exists(paths.layer(B))


def test_drop_layer_removes_marker_and_dir(tmp_path: Path) -> None:
    paths = Paths(str(tmp_path))
    paths.ensure()
    make_layer(paths, A, marked=True)
    paths.drop_layer(A)
    assert os.listdir(paths.layers) == [] and os.listdir(paths.verified) == []


def test_removal_outside_the_store_is_refused(tmp_path: Path) -> None:
    paths = Paths(str(tmp_path / "root"))
    paths.ensure()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "canary").write_text("keep")
    with pytest.raises(OutsideRoots):
        paths.remove(os.path.join(paths.layers, "..", "..", "..", "victim"))
    assert (victim / "canary").read_text() == "keep"


def test_a_stored_record_with_an_invalid_diff_id_is_dropped_not_used(tmp_path: Path) -> None:
    """A record written before digests were checked (e.g. diff ID "sha256:/etc") must not
    become a layer path at the next start."""
    async def main() -> None:
        db = Database(os.path.join(tmp_path, "x.db"))
        await db.open()
        try:
            paths = Paths(str(tmp_path))
            paths.ensure()
            good = {"id": "sha256:" + "1" * 64, "repo_tags": [], "repo_digests": [], "size": 1,
                    "config": {}, "diff_ids": [A]}
            bad = {**good, "id": "sha256:" + "2" * 64, "diff_ids": [A, "sha256:/etc"]}
            await db.put(KIND, good["id"], good)
            await db.put(KIND, bad["id"], bad)
            images = await Metadata(db, paths).load()
            assert list(images) == [good["id"]]
            assert images[good["id"]].layer_dirs == [paths.layer(A)]
            assert list(await db.load_all(KIND)) == [good["id"]]
        finally:
            await db.close()

    asyncio.run(main())
