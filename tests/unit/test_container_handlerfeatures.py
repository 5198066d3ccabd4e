"""Runtime handler features come from what the OCI runtime reports about itself."""

from __future__ import annotations

import json

from crishim.container.handlerfeatures import parse_mount_options


def test_rro_is_read_from_runc_features() -> None:
    runc = json.dumps({"ociVersionMin": "1.0.0", "mountOptions": ["ro", "rro", "rbind"]})
    assert "rro" in parse_mount_options(runc.encode())
    assert "rro" not in parse_mount_options(json.dumps({"mountOptions": ["ro"]}).encode())


def test_unreadable_features_announce_nothing() -> None:
    assert parse_mount_options(b"unknown command features") == frozenset()
    assert parse_mount_options(b'{"mountOptions": "rro"}') == frozenset()
    assert parse_mount_options(b"[]") == frozenset()
