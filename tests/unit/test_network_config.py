"""Default-network selection: which file in the CNI conf dir wins, and why others don't."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crishim.network.cni_config import CNIConfigError, ConfigLoader, load_default_network


@pytest.fixture
def bins(tmp_path: Path) -> list[str]:
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("bridge", "portmap", "loopback"):
        p = d / name
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    return [str(tmp_path / "missing-bin"), str(d)]


def write(conf_dir: Path, name: str, data: object) -> None:
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / name).write_text(json.dumps(data))


def conflist(name: str, *types: str, version: str = "1.0.0") -> dict[str, object]:
    return {"cniVersion": version, "name": name, "plugins": [{"type": t} for t in types]}


def test_lexically_first_valid_network_wins(tmp_path: Path, bins: list[str]) -> None:
    conf = tmp_path / "net.d"
    write(conf, "20-second.conflist", conflist("second", "bridge"))
    write(conf, "10-first.conflist", conflist("first", "bridge", "portmap"))
    write(conf, "README", "not a config")
    net = load_default_network(str(conf), bins)
    assert net.name == "first"
    assert [p["type"] for p in net.plugins] == ["bridge", "portmap"]
    # Binaries are searched in bin_dirs order; the missing dir is skipped.
    assert net.binaries["portmap"] == os.path.join(bins[1], "portmap")


def test_invalid_files_are_skipped_with_reasons(tmp_path: Path, bins: list[str]) -> None:
    conf = tmp_path / "net.d"
    write(conf, "00-broken.conflist", "{")
    (conf / "00-broken.conflist").write_text("{not json")
    write(conf, "05-noplugin.conflist", conflist("x", "nosuchplugin"))
    write(conf, "10-good.conflist", conflist("good", "bridge"))
    assert load_default_network(str(conf), bins).name == "good"
    (conf / "10-good.conflist").unlink()
    with pytest.raises(CNIConfigError) as err:
        load_default_network(str(conf), bins)
    assert "nosuchplugin" in str(err.value) and "not found" in str(err.value)
    assert "00-broken.conflist" in str(err.value)


def test_single_plugin_conf_is_wrapped_as_a_list(tmp_path: Path, bins: list[str]) -> None:
    conf = tmp_path / "net.d"
    write(conf, "10-single.conf", {"cniVersion": "0.4.0", "name": "single", "type": "bridge",
                                   "bridge": "cni0"})
    net = load_default_network(str(conf), bins)
    assert net.name == "single"
    assert net.cni_version == "0.4.0"
    assert net.raw["plugins"][0]["bridge"] == "cni0"


@pytest.mark.parametrize("version", ["0.3.1", "0.2.0", "2.0.0", ""])
def test_unsupported_versions_are_rejected(tmp_path: Path, bins: list[str],
                                           version: str) -> None:
    conf = tmp_path / "net.d"
    write(conf, "10-old.conflist", conflist("old", "bridge", version=version))
    with pytest.raises(CNIConfigError, match="not supported"):
        load_default_network(str(conf), bins)


def test_cni_versions_list_picks_newest_supported(tmp_path: Path, bins: list[str]) -> None:
    conf = tmp_path / "net.d"
    data = conflist("multi", "bridge", version="")
    data["cniVersions"] = ["0.4.0", "1.0.0", "9.9.9"]
    write(conf, "10-multi.conflist", data)
    net = load_default_network(str(conf), bins)
    assert net.cni_version == "1.0.0"
    assert net.raw["cniVersion"] == "1.0.0"


def test_missing_dir_and_empty_dir(tmp_path: Path, bins: list[str]) -> None:
    with pytest.raises(CNIConfigError, match="does not exist"):
        load_default_network(str(tmp_path / "nope"), bins)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CNIConfigError, match="no network config"):
        load_default_network(str(tmp_path / "empty"), bins)


async def test_loader_rereads_only_on_change(tmp_path: Path, bins: list[str]) -> None:
    conf = tmp_path / "net.d"
    loader = ConfigLoader(str(conf), bins)
    with pytest.raises(CNIConfigError):
        await loader.get()
    write(conf, "10-a.conflist", conflist("a", "bridge"))
    first = await loader.get()
    assert first.name == "a"
    assert await loader.get() is first  # unchanged dir: the cached object
    write(conf, "05-b.conflist", conflist("b", "bridge"))
    assert (await loader.get()).name == "b"
    # An in-place edit (same name) is noticed too.
    write(conf, "05-b.conflist", conflist("b2", "bridge", "portmap"))
    assert (await loader.get()).name == "b2"
