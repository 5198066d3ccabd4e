"""The bench images, built in Python and pushed to the loopback registry.

- pause: one layer holding the host's static catatonit, entrypoint ["/catatonit", "-P"]
  (containerd's sandbox_image; crishim embeds the same binary).
- busybox: the containers' image (tests/e2e/imagebuild.py).
- big-<n>: 5 layers, ~120 MiB uncompressed, gzip, half random data; one distinct image per
  pull repetition so every pull is cold even if a runtime keeps blobs after RemoveImage.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tests.e2e import imagebuild as ib

PAUSE_REPO = "bench/pause"
BUSYBOX_REPO = "bench/busybox"
BIG_REPO = "bench/big"


@dataclass
class BenchImages:
    host: str
    pause: str = ""
    busybox: str = ""
    big: list[str] = field(default_factory=list)
    big_bytes: int = 0  # compressed size of one big image (what goes over the wire)
    big_unpacked: int = 0  # uncompressed layer bytes
    pause_image: ib.BuiltImage | None = None
    busybox_image: ib.BuiltImage | None = None


def build_pause(catatonit: str) -> ib.BuiltImage:
    with open(catatonit, "rb") as fh:
        binary = fh.read()
    layer = [ib.file("catatonit", binary, 0o755), ib.directory("dev"), ib.directory("proc"),
             ib.directory("sys"), ib.directory("etc")]
    return ib.build_image([layer], config_overrides={
        "Entrypoint": ["/catatonit", "-P"], "Cmd": None, "Env": [ib.PATH_ENV]})


def build_big(seed: int, layers: int, total_mib: int) -> ib.BuiltImage:
    per = total_mib * 1024 * 1024 // layers
    tars: list[ib.LayerSpec] = [ib.big_layer_tar(per, seed * 1000 + i) for i in range(layers)]
    return ib.build_image(tars, config_overrides={"Cmd": ["/bin/sh"]})


def push_all(host: str, *, catatonit: str, big_count: int, big_layers: int = 5,
             big_mib: int = 120) -> BenchImages:
    out = BenchImages(host)
    out.pause_image = build_pause(catatonit)
    ib.push_image(host, PAUSE_REPO, "bench", out.pause_image)
    out.pause = ib.ref(host, PAUSE_REPO, "bench")
    out.busybox_image = ib.build_busybox()
    ib.push_image(host, BUSYBOX_REPO, "bench", out.busybox_image)
    out.busybox = ib.ref(host, BUSYBOX_REPO, "bench")

    def one(i: int) -> tuple[str, ib.BuiltImage]:
        img = build_big(i + 1, big_layers, big_mib)
        ib.push_image(host, BIG_REPO, f"r{i}", img)
        return ib.ref(host, BIG_REPO, f"r{i}"), img

    # gzip of ~120 MiB takes seconds; the two cores build two images at once.
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        for refname, img in pool.map(one, range(big_count)):
            out.big.append(refname)
            out.big_bytes = sum(len(b.data) for b in img.layers)
    out.big_unpacked = big_mib * 1024 * 1024
    return out


def write_hosts_toml(config_path: str, host: str) -> None:
    """containerd-style <config_path>/<host>/hosts.toml: plain http to the loopback registry."""
    d = os.path.join(config_path, host)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "hosts.toml"), "w") as fh:
        fh.write(f'server = "http://{host}"\n\n'
                 f'[host."http://{host}"]\n'
                 '  capabilities = ["pull", "resolve"]\n')
