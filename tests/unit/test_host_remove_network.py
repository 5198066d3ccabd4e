"""A pod's netns pin and its CNI cache entry are deleted only below the daemon's roots
(the cache: below its configured dir): a path elsewhere is refused and nothing there is
unmounted or removed (host/remove.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crishim.host.remove import OutsideRoots, Roots, unlink
from crishim.network import netns
from crishim.network.cache import ResultCache
from crishim.network.netns import remove_netns


def _victim(base: Path) -> Path:
    victim = base / "victim"
    victim.mkdir()
    (victim / "canary").write_text("keep")
    (victim / "p.json").write_text("keep")
    (victim / "p.json.tmp").write_text("keep")
    return victim


def _intact(victim: Path) -> bool:
    return all((victim / n).read_text() == "keep" for n in ("canary", "p.json", "p.json.tmp"))


async def test_a_netns_pin_outside_the_roots_is_refused(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    roots = Roots(str(tmp_path / "var"), str(tmp_path / "run"))
    netns = tmp_path / "run" / "netns"
    netns.mkdir(parents=True)
    os.symlink(victim, netns / "evil")
    for path in (str(victim / "canary"), f"{netns}/../../victim/canary",
                 str(netns / "evil" / "canary")):
        with pytest.raises(OutsideRoots):
            await remove_netns(path, roots=roots)
    assert _intact(victim)
    # A pin file of ours (not mounted: a crash before the bind) still goes.
    (netns / "pod").write_text("")
    await remove_netns(str(netns / "pod"), roots=roots)
    await remove_netns(str(netns / "pod"), roots=roots)  # idempotent
    assert not (netns / "pod").exists()


def test_the_cni_cache_deletes_only_in_its_own_dir(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    cache = ResultCache(str(tmp_path / "cni"))
    os.makedirs(cache.directory)
    # Ids that would lead out are not ids; a planted link is removed, never followed.
    for pod_id in ("../victim/p", "..", "", "/victim/p"):
        cache.remove(pod_id)
    os.symlink(victim / "p.json.tmp", os.path.join(cache.directory, "x.json.tmp"))
    cache.remove_partial_writes()
    assert os.listdir(cache.directory) == []
    assert _intact(victim)
    with pytest.raises(OutsideRoots):
        unlink(str(victim / "canary"), cache.roots)
    assert _intact(victim)


async def test_a_failed_netns_create_removes_no_file_outside_the_roots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = _victim(tmp_path)
    roots = Roots(str(tmp_path / "var"), str(tmp_path / "run"))
    (tmp_path / "run" / "netns").mkdir(parents=True)

    async def unshare_fails(fn: object) -> None:
        raise OSError("unshare: operation not permitted")

    monkeypatch.setattr(netns, "_on_fresh_thread", unshare_fails)
    with pytest.raises(OSError, match="unshare"):
        await netns.create_netns(str(victim / "canary"), roots=roots)
    assert _intact(victim)
    # Its own pin file, below the roots, is cleaned up.
    own = tmp_path / "run" / "netns" / "pod"
    own.write_text("")
    with pytest.raises(OSError, match="unshare"):
        await netns.create_netns(str(own), roots=roots)
    assert not own.exists()
