"""The container log directory and files conmon writes as root: nothing a pod planted in
the pod's log directory (a symlink) is followed out of it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from crishim.errors import FailedPrecondition
from crishim.host import logfiles


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "precious"
    target.parent.mkdir()
    target.write_bytes(b"precious\n")
    return target


def test_split_gives_the_pod_dir_and_the_relative_path() -> None:
    assert logfiles.split("/var/log/pods/p/c/0.log", "c/0.log") == ("/var/log/pods/p",
                                                                    "c/0.log")
    assert logfiles.split("/var/log/pods/p/0.log", "") == ("/var/log/pods/p", "0.log")


def test_log_dir_is_made_below_the_pod_dir(tmp_path: Path) -> None:
    pod = tmp_path / "logs" / "pod"
    logfiles.prepare_log(str(pod), "c/0.log", 0o755)
    assert stat.S_IMODE(os.stat(pod / "c").st_mode) == 0o755
    assert not (pod / "c" / "0.log").exists()  # conmon makes the file


@pytest.mark.parametrize("linked", ["pod", "c"])
def test_symlinked_log_dir_component_is_refused(tmp_path: Path, linked: str) -> None:
    outside = _outside(tmp_path).parent
    pod = tmp_path / "pod"
    if linked == "pod":
        pod.symlink_to(outside)
    else:
        pod.mkdir()
        (pod / "c").symlink_to(outside)
    with pytest.raises(FailedPrecondition, match="symlink"):
        logfiles.prepare_log(str(pod), "c/0.log", 0o755)
    assert sorted(os.listdir(outside)) == ["precious"]


def test_planted_log_and_tmp_links_are_removed_not_followed(tmp_path: Path) -> None:
    target = _outside(tmp_path)
    pod = tmp_path / "pod"
    pod.mkdir()
    (pod / "0.log").symlink_to(target)
    (pod / "0.log.tmp").symlink_to(target)
    logfiles.prepare_log(str(pod), "0.log", 0o755)
    assert os.listdir(pod) == []
    assert target.read_bytes() == b"precious\n"


def test_reopen_replaces_a_planted_tmp_link_with_a_file_of_its_own(tmp_path: Path) -> None:
    target = _outside(tmp_path)
    pod = tmp_path / "pod"
    (pod / "c").mkdir(parents=True)
    (pod / "c" / "0.log.tmp").symlink_to(target)
    logfiles.prepare_reopen(str(pod), "c/0.log")
    tmp = pod / "c" / "0.log.tmp"
    assert not tmp.is_symlink() and tmp.is_file() and tmp.stat().st_size == 0
    # conmon's open (create, truncate) now finds our file.
    with open(tmp, "wb") as fh:
        fh.write(b"log line\n")
    assert target.read_bytes() == b"precious\n"
    logfiles.discard_tmp(str(pod), "c/0.log")
    assert not tmp.exists()


def test_reopen_replaces_a_stale_tmp_file(tmp_path: Path) -> None:
    pod = tmp_path / "pod"
    pod.mkdir()
    (pod / "0.log.tmp").write_bytes(b"stale")
    logfiles.prepare_reopen(str(pod), "0.log")
    assert (pod / "0.log.tmp").read_bytes() == b""


def test_reopen_through_a_symlinked_dir_is_refused(tmp_path: Path) -> None:
    outside = _outside(tmp_path).parent
    pod = tmp_path / "pod"
    pod.mkdir()
    (pod / "c").symlink_to(outside)
    with pytest.raises(FailedPrecondition):
        logfiles.prepare_reopen(str(pod), "c/0.log")
    assert sorted(os.listdir(outside)) == ["precious"]
