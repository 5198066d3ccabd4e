"""The CDI spec directories: priority, conflicts, broken files, re-reading on change."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from crishim.cdi import registry as registry_mod
from crishim.cdi.edits import Injection
from crishim.cdi.registry import CDIRegistry
from crishim.cdi.spec import ContainerEdits
from crishim.errors import FailedPrecondition, InvalidArgument


def _write(path: Path, devices: dict[str, list[str]], kind: str = "vendor.com/dev",
           spec_env: list[str] | None = None, version: str = "0.3.0") -> None:
    doc: dict[str, Any] = {
        "cdiVersion": version, "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": env}} for n, env in devices.items()]}
    if spec_env:
        doc["containerEdits"] = {"env": spec_env}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _env(injections: list[Injection]) -> list[str]:
    return [e for inj in injections for e in inj.edits.env]


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "etc-cdi", tmp_path / "run-cdi"


def _registry(dirs: tuple[Path, Path]) -> CDIRegistry:
    return CDIRegistry([str(d) for d in dirs])


async def test_spec_edits_come_once_before_the_first_device_of_that_spec(
        dirs: tuple[Path, Path]) -> None:
    _write(dirs[0] / "a.json", {"x": ["X=1"], "y": ["Y=1"]}, spec_env=["SPEC=a"])
    _write(dirs[0] / "b.yaml", {"z": ["Z=1"]}, kind="other.com/dev")
    got = await _registry(dirs).resolve(["vendor.com/dev=y", "other.com/dev=z",
                                         "vendor.com/dev=x"])
    assert [i.origin for i in got] == [
        f"CDI spec {dirs[0] / 'a.json'}", f"CDI device vendor.com/dev=y ({dirs[0] / 'a.json'})",
        f"CDI device other.com/dev=z ({dirs[0] / 'b.yaml'})",
        f"CDI device vendor.com/dev=x ({dirs[0] / 'a.json'})"]
    assert _env(got) == ["SPEC=a", "Y=1", "Z=1", "X=1"]


async def test_nothing_requested_reads_nothing(tmp_path: Path) -> None:
    reg = CDIRegistry([str(tmp_path / "missing")], enabled=False)
    assert await reg.resolve([]) == []


async def test_disabled_cdi_refuses_requests(tmp_path: Path) -> None:
    reg = CDIRegistry([str(tmp_path)], enabled=False)
    with pytest.raises(FailedPrecondition, match=r"vendor.com/dev=a were requested but CDI "
                                                 r"is disabled .*enable_cdi = false"):
        await reg.resolve(["vendor.com/dev=a"])


async def test_a_later_directory_overrides_an_earlier_one(dirs: tuple[Path, Path]) -> None:
    _write(dirs[0] / "vendor.json", {"a": ["FROM=etc"], "b": ["B=etc"]})
    _write(dirs[1] / "vendor.json", {"a": ["FROM=run"]})
    reg = _registry(dirs)
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["FROM=run"]
    assert _env(await reg.resolve(["vendor.com/dev=b"])) == ["B=etc"]
    # The order of the configured directories decides, not their names.
    reg = CDIRegistry([str(dirs[1]), str(dirs[0])])
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["FROM=etc"]


async def test_the_same_device_twice_in_one_directory_is_an_error_for_that_device(
        dirs: tuple[Path, Path]) -> None:
    _write(dirs[0] / "one.json", {"a": ["A=1"], "b": ["B=1"]})
    _write(dirs[0] / "two.json", {"a": ["A=2"]})
    reg = _registry(dirs)
    with pytest.raises(InvalidArgument) as err:
        await reg.resolve(["vendor.com/dev=a"])
    assert str(err.value) == (
        "CDI device vendor.com/dev=a is defined by more than one spec file in the same "
        f"directory ({dirs[0] / 'one.json'}, {dirs[0] / 'two.json'}); remove all but one")
    assert _env(await reg.resolve(["vendor.com/dev=b"])) == ["B=1"]
    # A later directory's definition settles it.
    _write(dirs[1] / "three.json", {"a": ["A=3"]})
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["A=3"]


async def test_unknown_devices_name_the_devices_and_the_directories(
        dirs: tuple[Path, Path]) -> None:
    _write(dirs[0] / "a.json", {"a": ["A=1"]})
    with pytest.raises(InvalidArgument) as err:
        await _registry(dirs).resolve(["vendor.com/dev=a", "vendor.com/dev=nope",
                                       "other.com/x=1"])
    assert str(err.value) == (
        "unresolvable CDI devices vendor.com/dev=nope, other.com/x=1: no valid spec file in "
        f"{dirs[0]}, {dirs[1]} defines them")


async def test_a_broken_file_is_left_out_and_named_for_its_own_kind(
        dirs: tuple[Path, Path]) -> None:
    _write(dirs[0] / "good.json", {"a": ["A=1"]})
    _write(dirs[0] / "broken.json", {"b": ["B=1"]}, version="9.9.9")
    (dirs[0] / "garbage.yaml").write_text("kind: [")
    (dirs[0] / "other.yaml").write_text("kind: other.com/x\ncdiVersion: 0.3.0\ndevices: 1\n")
    reg = _registry(dirs)
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["A=1"]
    with pytest.raises(InvalidArgument) as err:
        await reg.resolve(["vendor.com/dev=b"])
    msg = str(err.value)
    assert msg.startswith("unresolvable CDI device vendor.com/dev=b: no valid spec file in ")
    assert (f"spec files with errors: {dirs[0] / 'broken.json'}: cdiVersion '9.9.9' is not a "
            "released CDI spec version") in msg
    # A file whose kind could not be read might have defined it; another kind's could not.
    assert f"{dirs[0] / 'garbage.yaml'}: not valid YAML" in msg
    assert "other.yaml" not in msg


async def test_files_other_than_json_and_yaml_and_subdirectories_are_ignored(
        dirs: tuple[Path, Path]) -> None:
    _write(dirs[0] / "a.yml", {"a": ["A=1"]})
    _write(dirs[0] / "a.json.bak", {"a": ["A=1"]})
    (dirs[0] / "sub.json").mkdir()
    with pytest.raises(InvalidArgument, match="unresolvable CDI device vendor.com/dev=a: no "
                                              r"valid spec file in [^;]*$"):
        await _registry(dirs).resolve(["vendor.com/dev=a"])


async def test_changes_are_seen_on_the_next_lookup(dirs: tuple[Path, Path]) -> None:
    path = dirs[0] / "a.json"
    _write(path, {"a": ["V=1"]})
    reg = _registry(dirs)
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["V=1"]
    # Rewritten in place at once: same size, likely the same timestamp tick.
    _write(path, {"a": ["V=2"]})
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["V=2"]
    # Replaced by rename, as well-behaved writers do.
    tmp = dirs[0] / ".a.json.tmp"
    _write(tmp, {"a": ["V=3"], "b": ["B=1"]})
    os.rename(tmp, path)
    assert _env(await reg.resolve(["vendor.com/dev=a", "vendor.com/dev=b"])) == ["V=3", "B=1"]
    # Broken, then fixed.
    path.write_text("{")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        await reg.resolve(["vendor.com/dev=a"])
    _write(path, {"a": ["V=4"]})
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["V=4"]
    # Removed.
    path.unlink()
    with pytest.raises(InvalidArgument, match="unresolvable"):
        await reg.resolve(["vendor.com/dev=a"])
    # A directory that appears later.
    _write(dirs[1] / "late.yaml", {"a": ["V=5"]})
    assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["V=5"]


async def test_unchanged_files_are_not_parsed_again(dirs: tuple[Path, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = dirs[0] / "a.json"
    _write(path, {"a": ["V=1"]})
    old = path.stat().st_mtime - 60
    os.utime(path, (old, old))  # long settled: no racy re-read
    reg = _registry(dirs)
    await reg.resolve(["vendor.com/dev=a"])
    parsed: list[Any] = []
    real = registry_mod.parse_document
    monkeypatch.setattr(registry_mod, "parse_document",
                        lambda doc: parsed.append(doc) or real(doc))
    reads: list[str] = []
    real_open = open

    def counting_open(file: Any, *a: Any, **kw: Any) -> Any:
        reads.append(str(file))
        return real_open(file, *a, **kw)

    monkeypatch.setattr("builtins.open", counting_open)
    for _ in range(3):
        assert _env(await reg.resolve(["vendor.com/dev=a"])) == ["V=1"]
    assert parsed == [] and reads == []


async def test_an_unreadable_directory_is_reported(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(InvalidArgument, match=rf"unreadable spec directories: {not_a_dir}: "
                                              "Not a directory"):
        await CDIRegistry([str(not_a_dir)]).resolve(["vendor.com/dev=a"])


async def test_spec_without_own_edits_adds_only_the_device(dirs: tuple[Path, Path]) -> None:
    _write(dirs[0] / "a.json", {"a": ["A=1"]})
    got = await _registry(dirs).resolve(["vendor.com/dev=a"])
    assert got == [Injection(f"CDI device vendor.com/dev=a ({dirs[0] / 'a.json'})",
                             ContainerEdits(env=("A=1",)))]
