"""image_root and [storage]: where the image store goes, and the writable-layer cap keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from crishim import config
from crishim.config import ConfigError, parse_size


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "crishim.toml"
    path.write_text(text)
    return str(path)


def test_the_image_store_is_under_root_by_default(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, "root = '/srv/crishim'"))
    assert cfg.image_root == "" and cfg.image_dir() == "/srv/crishim/images"
    assert cfg.storage.container_rootfs_size == cfg.storage.container_rootfs_size_max == ""


def test_image_root_moves_only_the_image_store(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, "root = '/var/lib/crishim'\n"
                                      "image_root = '/mnt/images/crishim'\n"))
    assert cfg.image_dir() == "/mnt/images/crishim"
    assert cfg.root == "/var/lib/crishim"  # containers, pods and the database stay
    flagged = config.load(write(tmp_path, ""), {"image_root": "/data/img"})
    assert flagged.image_dir() == "/data/img"
    # A dir of its own below root is fine (crishim's own dirs there are not).
    assert config.load(write(tmp_path, "root = '/r'\nimage_root = '/r/img'")).image_dir() \
        == "/r/img"


@pytest.mark.parametrize("text, message", [
    ("image_root = 'images'", "image_root must be an absolute path"),
    ("root = '/r'\nimage_root = '/r'", "image_root '/r' overlaps root '/r'"),
    ("root = '/r'\nimage_root = '/r/containers/x'", "overlaps root"),
    ("root = '/r'\nimage_root = '/r/sandboxes'", "overlaps root"),
    ("root = '/r/lib'\nimage_root = '/r'", "overlaps root"),
    ("state = '/run/c'\nimage_root = '/run/c/images'", "overlaps state '/run/c'"),
    ("state = '/run/c'\nimage_root = '/run'", "overlaps state"),
    ("[storage]\ncontainer_rootfs_size = '10 Gi'", "storage.container_rootfs_size must be "
                                                   "a size such as 10Gi"),
    ("[storage]\ncontainer_rootfs_size_max = '-1'", "container_rootfs_size_max must be a "
                                                    "size"),
    ("[storage]\ncontainer_rootfs_size = '0'", "must be a size"),
    ("[storage]\ncontainer_rootfs_size = 5", "config.storage.container_rootfs_size: "
                                             "expected str, got int"),
    ("[storage]\ncontainer_rootfs_size = '2Gi'\ncontainer_rootfs_size_max = '1Gi'",
     "container_rootfs_size is above storage.container_rootfs_size_max"),
    ("[storage]\nsize = '1G'", "config.storage: unknown key 'size'"),
])
def test_bad_storage_settings_are_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load(write(tmp_path, text))


def test_storage_keys_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, "image_root = '/mnt/img'\n[storage]\n"
                                      "container_rootfs_size = '10Gi'\n"
                                      "container_rootfs_size_max = '50G'\n"))
    again = config.load(write(tmp_path, config.to_toml(cfg)))
    assert again == cfg


@pytest.mark.parametrize("text, size", [
    ("1048576", 1048576), ("64Mi", 64 * 2**20), ("10Gi", 10 * 2**30), ("1Ti", 2**40),
    ("512k", 512_000), ("512K", 512_000), ("3M", 3_000_000), ("2G", 2 * 10**9),
    (" 8Ki ", 8192),
])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "0Gi", "Gi", "1.5G", "1GB", "1 G", "-5", "1gi"])
def test_what_is_not_a_size(text: str) -> None:
    assert parse_size(text) is None
