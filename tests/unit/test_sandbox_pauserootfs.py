"""The embedded pause's rootfs (sandbox/pauserootfs.py): checked by content, rebuilt whole
when anything differs, nothing followed while building or replacing."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from crishim.errors import FailedPrecondition
from crishim.sandbox import pauserootfs as prf


@pytest.fixture
def catatonit(tmp_path: Path) -> Path:
    src = tmp_path / "catatonit-src"
    src.write_bytes(b"\x7fELF" + bytes(range(256)) * 300)
    return src


def _ids() -> tuple[int, int]:
    return os.geteuid(), os.getegid()


def _want(src: Path) -> prf.Manifest:
    return prf.expected(hashlib.sha256(src.read_bytes()).hexdigest(), *_ids())


def test_expected_layout_and_digest() -> None:
    m = prf.expected("ab" * 32, 0, 0)
    assert m["."] == "dir 711 0:0"
    assert m["catatonit"] == "file 755 0:0 " + "ab" * 32
    assert m["etc/hosts"] == f"file 644 0:0 {prf.EMPTY_SHA256}"
    assert {"proc", "dev", "sys", "etc", "tmp"} <= set(m)
    # One digest for the whole tree: any entry's change changes it, order does not.
    assert prf.digest(m) == prf.digest(dict(reversed(list(m.items()))))
    assert prf.digest(m) != prf.digest(prf.expected("cd" * 32, 0, 0))
    assert prf.digest(m) != prf.digest({**m, "etc/extra": "symlink /x"})


def test_built_once_and_then_kept(tmp_path: Path, catatonit: Path) -> None:
    rootfs = prf.ensure(str(tmp_path / "root"), str(catatonit))
    assert rootfs == str(tmp_path / "root" / "pause" / "rootfs")
    assert prf.manifest(rootfs) == _want(catatonit)
    assert Path(rootfs, "catatonit").read_bytes() == catatonit.read_bytes()
    ino = os.stat(rootfs).st_ino
    assert prf.ensure(str(tmp_path / "root"), str(catatonit)) == rootfs
    assert os.stat(rootfs).st_ino == ino  # right as it was: not rebuilt


def test_planted_symlinks_are_replaced_and_never_followed(tmp_path: Path,
                                                          catatonit: Path) -> None:
    root = str(tmp_path / "root")
    rootfs = Path(prf.ensure(root, str(catatonit)))
    precious = tmp_path / "precious"
    precious.write_text("host file\n")
    before = os.stat(precious)
    (rootfs / "etc" / "hosts").unlink()
    (rootfs / "etc" / "hosts").symlink_to(precious)
    (rootfs / "tmp" / "link").symlink_to(tmp_path)
    prf.ensure(root, str(catatonit))
    assert prf.manifest(str(rootfs)) == _want(catatonit)
    assert precious.read_text() == "host file\n"
    after = os.stat(precious)
    assert (after.st_mtime_ns, after.st_mode) == (before.st_mtime_ns, before.st_mode)
    assert sorted(os.listdir(tmp_path)) == ["catatonit-src", "precious", "root"]
    assert sorted(os.listdir(rootfs.parent)) == [".lock", "rootfs"]


def test_same_size_newer_catatonit_is_replaced(tmp_path: Path, catatonit: Path) -> None:
    root = str(tmp_path / "root")
    rootfs = Path(prf.ensure(root, str(catatonit)))
    data = bytearray(catatonit.read_bytes())
    data[100] ^= 0xFF
    (rootfs / "catatonit").write_bytes(bytes(data))  # same size, a newer mtime
    prf.ensure(root, str(catatonit))
    assert (rootfs / "catatonit").read_bytes() == catatonit.read_bytes()


def test_a_changed_source_is_copied_again(tmp_path: Path, catatonit: Path) -> None:
    root = str(tmp_path / "root")
    rootfs = Path(prf.ensure(root, str(catatonit)))
    catatonit.write_bytes(b"\x7fELF a new release")
    prf.ensure(root, str(catatonit))
    assert (rootfs / "catatonit").read_bytes() == b"\x7fELF a new release"


def test_rootfs_planted_as_a_symlink_is_replaced(tmp_path: Path, catatonit: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    pause = tmp_path / "root" / "pause"
    pause.mkdir(parents=True)
    (pause / "rootfs").symlink_to(elsewhere)
    prf.ensure(str(tmp_path / "root"), str(catatonit))
    assert not (pause / "rootfs").is_symlink()
    assert prf.manifest(str(pause / "rootfs")) == _want(catatonit)
    assert os.listdir(elsewhere) == ["keep"]


def test_build_creates_nothing_through_a_link(tmp_path: Path, catatonit: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    new = tmp_path / "new"
    new.mkdir()
    (new / "etc").symlink_to(outside)
    with pytest.raises(FileExistsError):
        prf.build(str(new), str(catatonit))
    assert os.listdir(outside) == []
    new2 = tmp_path / "new2"
    new2.mkdir()
    (new2 / "catatonit").symlink_to(outside / "bin")
    with pytest.raises(FileExistsError):
        prf.build(str(new2), str(catatonit))
    assert os.listdir(outside) == []


def test_concurrent_first_calls_agree(tmp_path: Path, catatonit: Path) -> None:
    root = str(tmp_path / "root")
    rootfs = Path(prf.ensure(root, str(catatonit)))
    (rootfs / "planted").write_text("x")
    results: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(prf.ensure(root, str(catatonit)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [str(rootfs)] * 8
    assert prf.manifest(str(rootfs)) == _want(catatonit)
    assert sorted(os.listdir(rootfs.parent)) == [".lock", "rootfs"]


def test_missing_catatonit_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="install catatonit or set pause_image"):
        prf.ensure(str(tmp_path / "root"), str(tmp_path / "nope"))
