"""User resolution against the image rootfs, never following links out of it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from crishim.container import user as user_mod
from crishim.container.user import (
    MAX_IMAGE_FILE,
    UserRequest,
    read_image_file,
    resolve_user,
    scoped_path,
)
from crishim.errors import FailedPrecondition, InvalidArgument

PASSWD = """root:x:0:0:root:/root:/bin/sh
daemon:x:1:1::/usr/sbin:/bin/false
app:x:1000:1000:app:/home/app:/bin/sh
"""
GROUP = """root:x:0:
wheel:x:10:app,root
app:x:1000:
audio:x:29:app
staff:x:50:
"""


@pytest.fixture
def rootfs(tmp_path: Path) -> str:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(PASSWD)
    (tmp_path / "etc/group").write_text(GROUP)
    return str(tmp_path)


def test_image_user_forms(rootfs: str) -> None:
    u = resolve_user(rootfs, "app", UserRequest())
    assert (u.uid, u.gid, u.additional_gids) == (1000, 1000, [1000, 10, 29])
    assert resolve_user(rootfs, "1000", UserRequest()).gid == 1000
    u = resolve_user(rootfs, "1000:50", UserRequest())
    assert (u.uid, u.gid) == (1000, 50)
    u = resolve_user(rootfs, "app:staff", UserRequest())
    assert (u.uid, u.gid) == (1000, 50)
    u = resolve_user(rootfs, "4242", UserRequest())  # unknown numeric uid is fine
    assert (u.uid, u.gid, u.additional_gids) == (4242, 0, [0])
    u = resolve_user(rootfs, "", UserRequest())
    assert (u.uid, u.gid, u.additional_gids) == (0, 0, [0, 10])


def test_unknown_names_are_errors(rootfs: str) -> None:
    with pytest.raises(InvalidArgument, match="nobody"):
        resolve_user(rootfs, "nobody", UserRequest())
    with pytest.raises(InvalidArgument, match="nogroup"):
        resolve_user(rootfs, "app:nogroup", UserRequest())


def test_cri_overrides_image_user(rootfs: str) -> None:
    u = resolve_user(rootfs, "daemon", UserRequest(run_as_user=1000, run_as_group=29,
                                                   supplemental_groups=[5000, 10]))
    assert (u.uid, u.gid, u.additional_gids) == (1000, 29, [29, 10, 5000])
    u = resolve_user(rootfs, "", UserRequest(run_as_username="app"))
    assert u.uid == 1000


def test_group_without_user_is_refused(rootfs: str) -> None:
    # critest: RunAsGroup without RunAsUser/RunAsUsername must fail CreateContainer, even
    # when the image names a user.
    for image_user in ("", "app"):
        with pytest.raises(InvalidArgument, match="run_as_group 1002"):
            resolve_user(rootfs, image_user, UserRequest(run_as_group=1002))
    assert resolve_user(rootfs, "", UserRequest(run_as_username="app",
                                                run_as_group=1002)).gid == 1002


def test_strict_policy_ignores_etc_group(rootfs: str) -> None:
    u = resolve_user(rootfs, "app", UserRequest(supplemental_groups=[5000],
                                                strict_groups=True))
    assert u.additional_gids == [1000, 5000]


OUT_OF_RANGE_PASSWD = """big:x:4294967296:1000::/:/bin/sh
neg:x:-1:1000::/:/bin/sh
past-int32:x:2147483648:1000::/:/bin/sh
neg-gid:x:1002:-1::/:/bin/sh
4294967296:x:0:0::/root:/bin/sh
grouped:x:1001:1001::/:/bin/sh
"""


@pytest.mark.parametrize("image_user", [
    "4294967296", "-1", "2147483648", "0:4294967296", "1000:-1", "1000:2147483648",
    "big", "neg", "past-int32", "neg-gid", "grouped", "app:huge"])
def test_image_ids_past_int32_are_refused_never_wrapped(rootfs: str, image_user: str) -> None:
    # containerd CVE-2024-40635: such an id, cut to 32 bits, ran the container as root.
    with open(os.path.join(rootfs, "etc/passwd"), "a") as fh:
        fh.write(OUT_OF_RANGE_PASSWD)
    with open(os.path.join(rootfs, "etc/group"), "a") as fh:
        fh.write("huge:x:4294967296:grouped\n")
    with pytest.raises(FailedPrecondition, match=r"image.*out of range.*2147483647"):
        resolve_user(rootfs, image_user, UserRequest())


def test_out_of_range_passwd_gid_is_not_used_when_the_request_sets_the_group(
        rootfs: str) -> None:
    with open(os.path.join(rootfs, "etc/passwd"), "a") as fh:
        fh.write("neg-gid:x:1002:-1::/:/bin/sh\n")
    u = resolve_user(rootfs, "", UserRequest(run_as_username="neg-gid", run_as_group=7))
    assert (u.uid, u.gid) == (1002, 7)


def test_the_largest_id_is_taken(tmp_path: Path) -> None:
    u = resolve_user(str(tmp_path), "2147483647:2147483647", UserRequest())
    assert (u.uid, u.gid, u.additional_gids) == (2**31 - 1, 2**31 - 1, [2**31 - 1])


@pytest.mark.parametrize("image_user", ["\u0661\u0660\u0660\u0660", "\u00b2", "+5", " 5"])
def test_only_ascii_decimals_are_ids(rootfs: str, image_user: str) -> None:
    # Other scripts' digits pass str.isdigit (and some int()): they are names here.
    with pytest.raises(InvalidArgument, match="not found in the image's /etc/passwd"):
        resolve_user(rootfs, image_user, UserRequest())


def test_passwd_symlink_stays_inside_rootfs(tmp_path: Path) -> None:
    outside = tmp_path / "host-passwd"
    outside.write_text("evil:x:7:7::/:/bin/sh\n")
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    # Absolute and ../.. links must resolve inside the rootfs, not on the host.
    os.symlink(str(outside), root / "etc/passwd")
    assert scoped_path(str(root), "/etc/passwd") == str(root) + str(outside)
    with pytest.raises(InvalidArgument):
        resolve_user(str(root), "evil", UserRequest())
    os.unlink(root / "etc/passwd")
    os.symlink("../../../host-passwd", root / "etc/passwd")
    assert scoped_path(str(root), "/etc/passwd") == str(root / "host-passwd")
    with pytest.raises(InvalidArgument):
        resolve_user(str(root), "evil", UserRequest())


def test_symlink_loop_is_an_error(tmp_path: Path) -> None:
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    with pytest.raises(InvalidArgument, match="symbolic links"):
        scoped_path(str(tmp_path), "/a")


# Files read from an image are untrusted: only a regular, bounded file is ever opened.

def _both_resolvers(monkeypatch: pytest.MonkeyPatch, fallback: bool) -> None:
    monkeypatch.setattr(user_mod, "_openat2_missing", fallback)


@pytest.fixture(params=[False, True], ids=["openat2", "scoped"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    _both_resolvers(monkeypatch, request.param)
    return bool(request.param)


def test_fifo_passwd_is_refused_without_hanging(tmp_path: Path, resolver: bool) -> None:
    (tmp_path / "etc").mkdir()
    os.mkfifo(tmp_path / "etc/passwd")
    with pytest.raises(FailedPrecondition, match=r"/etc/passwd is a FIFO"):
        resolve_user(str(tmp_path), "app", UserRequest())


def test_device_node_group_is_refused(tmp_path: Path, resolver: bool) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(PASSWD)
    os.mknod(tmp_path / "etc/group", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null
    with pytest.raises(FailedPrecondition, match=r"/etc/group is a character device"):
        resolve_user(str(tmp_path), "app", UserRequest())


def test_link_to_host_shadow_reads_the_images_own_path(tmp_path: Path,
                                                       resolver: bool) -> None:
    (tmp_path / "etc").mkdir()
    os.symlink("/etc/shadow", tmp_path / "etc/passwd")
    # The host's /etc/shadow is never read: the link lands on the image's (absent) one.
    assert read_image_file(str(tmp_path), "/etc/passwd") is None
    (tmp_path / "etc/shadow").write_text("inimage:x:5:5::/:/bin/sh\n")
    assert read_image_file(str(tmp_path), "/etc/passwd") == b"inimage:x:5:5::/:/bin/sh\n"
    os.unlink(tmp_path / "etc/passwd")
    os.symlink("../../../../../../etc/shadow", tmp_path / "etc/passwd")
    assert read_image_file(str(tmp_path), "/etc/passwd") == b"inimage:x:5:5::/:/bin/sh\n"


def test_etc_as_a_symlink_inside_the_image_is_followed(tmp_path: Path,
                                                       resolver: bool) -> None:
    (tmp_path / "usr/etc").mkdir(parents=True)
    (tmp_path / "usr/etc/passwd").write_text(PASSWD)
    os.symlink("/usr/etc", tmp_path / "etc")
    assert resolve_user(str(tmp_path), "app", UserRequest()).uid == 1000


def test_huge_passwd_is_refused(tmp_path: Path, resolver: bool) -> None:
    (tmp_path / "etc").mkdir()
    with open(tmp_path / "etc/passwd", "wb") as fh:
        fh.truncate(MAX_IMAGE_FILE + 1)  # sparse: costs no disk
    with pytest.raises(FailedPrecondition, match=r"/etc/passwd is \d+ bytes, larger"):
        resolve_user(str(tmp_path), "app", UserRequest())


def test_passwd_symlink_loop_is_refused(tmp_path: Path, resolver: bool) -> None:
    (tmp_path / "etc").mkdir()
    os.symlink("passwd2", tmp_path / "etc/passwd")
    os.symlink("passwd", tmp_path / "etc/passwd2")
    with pytest.raises(FailedPrecondition, match="symbolic links"):
        resolve_user(str(tmp_path), "app", UserRequest())


def test_missing_files_resolve_numeric_users(tmp_path: Path, resolver: bool) -> None:
    assert resolve_user(str(tmp_path), "1234", UserRequest()).uid == 1234
