"""Slices crishim makes for pods' parents (systemd driver): stopped when the last pod that
counts on them goes, never while another pod uses or is about to use them."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from crishim.oci.slices import expand_slice
from crishim.sandbox.slices import MadeSlices


class FakeSystemd:
    """A cgroup tree in a directory: a pod's scope appears where runc would ask for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stopped: list[str] = []

    def scope(self, parent_slice: str, pod: str) -> Path:
        d = Path(str(self.root) + expand_slice(parent_slice)) / f"crishim-{pod}.scope"
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("1\n")
        for up in d.parents:  # every slice up the nesting has its (empty) procs file
            if up == self.root:
                break
            (up / "cgroup.procs").touch()
        return d

    async def stop(self, name: str) -> None:
        self.stopped.append(name)
        shutil.rmtree(str(self.root) + expand_slice(name))

    def has(self, name: str) -> bool:
        return os.path.isdir(str(self.root) + expand_slice(name))


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.mark.parametrize("first_out", ["a", "b"])
def test_shared_made_slice_goes_with_the_last_pod_either_order(tmp_path: Path,
                                                               first_out: str) -> None:
    sd = FakeSystemd(tmp_path)
    slices = MadeSlices(str(tmp_path), sd.stop)

    async def scenario() -> None:
        made_a = await slices.claim("/t.slice/t-x.slice")
        scope_a = sd.scope("t-x.slice", "a")
        made_b = await slices.claim("/t.slice/t-x.slice")  # exists now, made by us
        scope_b = sd.scope("t-x.slice", "b")
        assert made_a == made_b == ["t-x.slice", "t.slice"]
        gone, stays = (scope_a, scope_b) if first_out == "a" else (scope_b, scope_a)
        shutil.rmtree(gone)
        await slices.release(made_a if first_out == "a" else made_b)
        assert sd.stopped == [] and sd.has("t-x.slice")
        shutil.rmtree(stays)
        await slices.release(made_b if first_out == "a" else made_a)
        assert sd.stopped == ["t-x.slice", "t.slice"]
        assert not sd.has("t.slice")
    run(scenario())


def test_slices_someone_else_made_are_left_alone(tmp_path: Path) -> None:
    sd = FakeSystemd(tmp_path)
    (tmp_path / "kubepods.slice" / "kubepods-pod1.slice").mkdir(parents=True)
    slices = MadeSlices(str(tmp_path), sd.stop)

    async def scenario() -> None:
        assert await slices.claim("/kubepods.slice/kubepods-pod1.slice") == []
        # A sibling the kubelet did not make: only it is ours, not kubepods.slice.
        made = await slices.claim("kubepods-pod2.slice")
        assert made == ["kubepods-pod2.slice"]
        shutil.rmtree(sd.scope("kubepods-pod2.slice", "a"))
        await slices.release(made)
        assert sd.stopped == ["kubepods-pod2.slice"]
    run(scenario())


def test_a_starting_pod_keeps_the_slice_a_leaving_pod_made(tmp_path: Path) -> None:
    """Pod b claims the slice before its scope exists; pod a, the maker, leaves: the
    slice is empty at that moment but must stay for b."""
    sd = FakeSystemd(tmp_path)
    slices = MadeSlices(str(tmp_path), sd.stop)

    async def scenario() -> None:
        made_a = await slices.claim("t.slice")
        scope_a = sd.scope("t.slice", "a")
        made_b = await slices.claim("t.slice")
        shutil.rmtree(scope_a)
        await slices.release(made_a)
        assert sd.stopped == []
        await slices.release(made_b)
        assert sd.stopped == ["t.slice"]
        await slices.release(made_b)  # a retried remove: nothing more to do
        assert sd.stopped == ["t.slice"]
    run(scenario())


def test_records_read_at_start_count_again(tmp_path: Path) -> None:
    sd = FakeSystemd(tmp_path)
    sd.scope("t.slice", "a")
    shutil.rmtree(tmp_path / "t.slice" / "crishim-a.scope")
    sd.scope("t.slice", "b")
    slices = MadeSlices(str(tmp_path), sd.stop)  # a restarted daemon
    slices.adopt(["t.slice"])
    slices.adopt(["t.slice"])

    async def scenario() -> None:
        await slices.release(["t.slice"])  # pod a goes; b still counts on it
        assert sd.stopped == []
        shutil.rmtree(tmp_path / "t.slice" / "crishim-b.scope")
        await slices.release(["t.slice"])
        assert sd.stopped == ["t.slice"]
    run(scenario())
