"""Safe layer unpacking: features an overlay rootfs needs, and a corpus of malicious layers
that must not write anything outside the layer directory."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest

from crishim.errors import Kind
from crishim.image.unpack import UnsafeLayer, unpack
from tests.e2e.imagebuild import (
    Entry,
    chardev,
    directory,
    fifo,
    file,
    hardlink,
    make_tar,
    opaque,
    symlink,
    whiteout,
)

ROOT = os.geteuid() == 0


Snap = tuple[int, int, int, int, int, bytes | str]


def snapshot(top: Path, skip: Path) -> dict[str, Snap]:
    """Every path below `top` except `skip`: mode, owner, group, size, mtime and
    content/link target (a layer that changed any of them outside its dir is caught)."""
    out: dict[str, Snap] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p == skip:
                continue
            st = p.lstat()
            data: bytes | str = b""
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                data = p.read_bytes()
            out[str(p)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, data)
    return out


def xattr_support(path: Path, name: str) -> str:
    """"" if the filesystem at `path` stores xattr `name`, else why not (a probe, so a
    test skips only where the host cannot hold what it checks)."""
    probe = path / ".xattr-probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, name, b"1")
        return "" if os.getxattr(probe, name) == b"1" else f"{name} reads back wrong"
    except OSError as exc:
        return f"{path} does not store {name} xattrs: {exc.strerror}"
    finally:
        probe.unlink()


@pytest.fixture
def area(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("secret")
    (outside / "dir").mkdir()
    layer = tmp_path / "layer"
    layer.mkdir()
    return tmp_path, layer


def run(layer: Path, entries: list[Entry]) -> None:
    unpack(io.BytesIO(make_tar(entries)), str(layer))


def malicious_corpus(outside: Path) -> list[tuple[str, list[Entry], bool]]:
    """(name, entries, rejected?) — neutralised cases unpack but stay inside."""
    o = str(outside)
    return [
        ("dotdot", [file("../evil", "x")], True),
        ("dotdot-deep", [directory("a"), file("a/../../evil", "x")], True),
        ("dotdot-in-dir", [directory("a/../../evil")], True),
        ("absolute-path", [file(o + "/abs", "x")], False),
        ("symlink-abs-then-file", [symlink("l", o), file("l/evil", "x")], True),
        ("symlink-rel-then-file", [symlink("l", "../.."), file("l/evil", "x")], True),
        ("symlink-chain", [symlink("a", "b"), symlink("b", o), file("a/evil", "x")], True),
        ("symlink-then-dir", [symlink("l", o), directory("l/sub")], True),
        ("symlink-then-mkdir-parent", [symlink("l", o), file("l/new/evil", "x")], True),
        ("hardlink-absolute", [hardlink("h", o + "/secret")], True),
        ("hardlink-dotdot", [hardlink("h", "../outside/secret")], True),
        ("hardlink-through-symlink", [symlink("l", o), hardlink("h", "l/secret")], True),
        ("symlink-replaced-by-file", [symlink("f", o + "/secret"), file("f", "pwned")], False),
        ("symlink-dir-replaced-by-dir", [symlink("d", o + "/dir"), directory("d"),
                                        file("d/x", "x")], False),
        ("whiteout-through-symlink", [symlink("l", o), file("l/.wh.secret", "")], True),
        ("opaque-through-symlink", [symlink("l", o), file("l/.wh..wh..opq", "")], True),
        ("whiteout-dotdot", [directory("a"), file("a/.wh...", "")], True),
        ("hardlink-then-write", [file("t", "t"), hardlink("h", "t"), file("h", "new")], False),
        ("overlay-xattr-smuggling", [directory("d", xattrs={"trusted.overlay.redirect": "/x"})],
         False),
        ("device-through-symlink", [symlink("l", o), chardev("l/null", 1, 3)], True),
    ]


@pytest.mark.parametrize("case", range(len(malicious_corpus(Path("/x")))),
                         ids=[c[0] for c in malicious_corpus(Path("/x"))])
def test_malicious_layer_writes_nothing_outside(area: tuple[Path, Path], case: int) -> None:
    top, layer = area
    name, entries, rejected = malicious_corpus(top / "outside")[case]
    before = snapshot(top, layer)
    if rejected:
        with pytest.raises(UnsafeLayer) as exc:
            run(layer, entries)
        # The image is at fault: the client gets FAILED_PRECONDITION, not INTERNAL.
        assert exc.value.code == Kind.FAILED_PRECONDITION
    else:
        run(layer, entries)
    assert snapshot(top, layer) == before, f"{name} changed something outside the layer"
    # Nothing inside the layer may point a write outside either: no symlink was followed.
    assert (top / "outside" / "secret").read_text() == "secret"


def test_neutralised_cases_land_inside(area: tuple[Path, Path]) -> None:
    top, layer = area
    o = str(top / "outside")
    run(layer, [file(o + "/abs", "x"), symlink("f", o + "/secret"), file("f", "pwned"),
                directory("d", xattrs={"trusted.overlay.redirect": "/x"})])
    assert (layer / o.lstrip("/") / "abs").read_text() == "x"
    assert not (layer / "f").is_symlink() and (layer / "f").read_text() == "pwned"
    if ROOT:
        assert b"trusted.overlay.redirect" not in " ".join(os.listxattr(layer / "d")).encode()


@pytest.mark.skipif(not ROOT, reason="ownership, devices and whiteouts need root")
def test_layer_features(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    layer.mkdir()
    run(layer, [
        directory("etc", 0o755),
        file("etc/app.conf", "conf", 0o640, 1000, 1001, mtime=1_600_000_000),
        file("bin/su", "su", 0o4755),
        symlink("bin/sh", "busybox"),
        file("data/keep", "keep"),
        hardlink("data/hard", "data/keep"),
        whiteout("data/gone"),
        directory("opq"),
        opaque("opq"),
        file("opq/new", "n"),
        fifo("run/fifo", 0o600),
        chardev("dev/null", 1, 3, 0o666),
        directory("ro", 0o555),
        file("ro/inside", "i"),
    ])
    conf = (layer / "etc/app.conf").stat()
    assert (conf.st_uid, conf.st_gid, stat.S_IMODE(conf.st_mode)) == (1000, 1001, 0o640)
    assert int(conf.st_mtime) == 1_600_000_000
    assert stat.S_IMODE((layer / "bin/su").stat().st_mode) == 0o4755
    assert os.readlink(layer / "bin/sh") == "busybox"
    assert (layer / "data/hard").stat().st_ino == (layer / "data/keep").stat().st_ino
    gone = (layer / "data/gone").lstat()
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == os.makedev(0, 0)
    assert os.getxattr(layer / "opq", "trusted.overlay.opaque") == b"y"
    assert (layer / "opq/new").read_text() == "n"
    assert stat.S_ISFIFO((layer / "run/fifo").lstat().st_mode)
    assert (layer / "dev/null").lstat().st_rdev == os.makedev(1, 3)
    assert stat.S_IMODE((layer / "ro").stat().st_mode) == 0o555
    assert (layer / "ro/inside").read_text() == "i"
    assert int((layer / "etc").stat().st_mtime) == 1_700_000_000  # dir mtimes restored last


@pytest.mark.parametrize("name", ["user.note", "trusted.note", "security.note"])
def test_layer_xattrs_are_kept(tmp_path: Path, name: str) -> None:
    """Files and directories keep the xattrs their tar entries carry (capabilities and
    SELinux labels are xattrs: dropping them breaks the image)."""
    layer = tmp_path / "layer"
    layer.mkdir()
    if why := xattr_support(layer, name):
        pytest.skip(why)
    run(layer, [file("x", "x", xattrs={name: "hello"}),
                directory("d", xattrs={name: "dir"}),
                file("d/y", "y", xattrs={name: "nested"})])
    assert os.getxattr(layer / "x", name) == b"hello"
    assert os.getxattr(layer / "d", name) == b"dir"
    assert os.getxattr(layer / "d/y", name) == b"nested"


def test_aufs_metadata_is_skipped(tmp_path: Path) -> None:
    run(tmp_path, [directory(".wh..wh.plnk"), file(".wh..wh.plnk/123.456", "x"),
                   file("keep", "k")])
    assert sorted(os.listdir(tmp_path)) == ["keep"]


def test_not_a_tar(tmp_path: Path) -> None:
    with pytest.raises(UnsafeLayer, match="not a valid tar"):
        unpack(io.BytesIO(b"\x01" * 1024), str(tmp_path))
