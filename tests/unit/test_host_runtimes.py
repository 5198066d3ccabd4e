"""Runtime handler features come from what the OCI runtime reports about itself."""

from __future__ import annotations

import json

import pytest

from crishim.host import idmap, runtimes
from crishim.host.runtimes import RuntimeFeatures, parse_mount_options

RUNC = json.dumps({"mountOptions": ["ro", "rro"],
                   "linux": {"namespaces": ["mount", "user"]}}).encode()


def test_rro_is_read_from_runc_features() -> None:
    runc = json.dumps({"ociVersionMin": "1.0.0", "mountOptions": ["ro", "rro", "rbind"]})
    assert "rro" in parse_mount_options(runc.encode())
    assert "rro" not in parse_mount_options(json.dumps({"mountOptions": ["ro"]}).encode())


def test_unreadable_features_announce_nothing() -> None:
    assert parse_mount_options(b"unknown command features") == frozenset()
    assert parse_mount_options(b'{"mountOptions": "rro"}') == frozenset()
    assert parse_mount_options(b"[]") == frozenset()


async def test_probe_judges_each_handler_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    async def supports_idmap(path: str) -> str:
        asked.append(path)
        return ""

    monkeypatch.setattr(idmap, "supports_idmap", supports_idmap)
    found = await runtimes.probe({"runc": RUNC, "crun": b""}, True, "/layers")
    assert found == {"runc": RuntimeFeatures(RUNC, True, True), "crun": RuntimeFeatures()}
    assert asked == ["/layers"]  # one filesystem probe for all handlers
    old_kernel = await runtimes.probe({"runc": RUNC}, False, "/layers")
    assert not old_kernel["runc"].recursive_read_only_mounts


async def test_no_idmap_means_no_user_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    async def supports_idmap(path: str) -> str:
        return "EINVAL"

    monkeypatch.setattr(idmap, "supports_idmap", supports_idmap)
    found = await runtimes.probe({"runc": RUNC}, True, "/layers")
    assert found["runc"] == RuntimeFeatures(RUNC, True, False)


async def test_idmap_is_not_probed_without_a_user_namespace_runtime(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def supports_idmap(path: str) -> str:
        raise AssertionError("probed")

    monkeypatch.setattr(idmap, "supports_idmap", supports_idmap)
    only_rro = json.dumps({"mountOptions": ["rro"]}).encode()
    assert (await runtimes.probe({"runc": only_rro}, True, "/l"))["runc"].recursive_read_only_mounts
