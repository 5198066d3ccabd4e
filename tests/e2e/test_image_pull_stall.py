"""image_pull_progress_timeout against the real docker-registry behind a proxy that stalls:
a pull whose registry goes silent ends with a clear error within seconds and leaves
nothing behind, the same pull works once the registry heals (and a container from it
runs on runc), and a slow pull that keeps receiving bytes is never cancelled."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e import imagebuild as ib
from tests.e2e.cni import module_network
from tests.e2e.daemon import Daemon, running_daemon
from tests.e2e.faults import DurabilityEnv, networked_daemon, wait_for
from tests.e2e.registry import Registry, TokenProxy

TIMEOUT = 3.0
CONFIG = f"[registry]\nimage_pull_progress_timeout = {TIMEOUT}\n"


def pull(d: Daemon, ref: str, timeout: float = 60) -> str:
    return str(d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)),
                                    timeout=timeout).image_ref)


def store(d: Daemon) -> dict[str, list[str]]:
    """What the image store holds: listed images and every file under its dirs."""
    base = os.path.join(d.root, "images")
    out = {"listed": sorted(i.id for i in d.images().ListImages(pb.ListImagesRequest()).images)}
    for sub in ("layers", "tmp", "blobs/sha256"):
        out[sub] = sorted(os.listdir(os.path.join(base, sub)))
    return out


def big_image(name: str) -> ib.BuiltImage:
    # 1 MiB of noise: gzip cannot shrink it, so the proxy has a real body to hold back.
    return ib.build_busybox(extra_layers=[[ib.file(name, os.urandom(1 << 20))]])


def test_stalled_layer_fails_fast_leaves_nothing_and_the_healed_pull_runs(
        registry: Registry) -> None:
    img = big_image("stall")
    ib.push_image(registry.host, "stall/app", "v1", img)
    big = img.layers[1].digest
    stalling = threading.Event()
    stalling.set()

    def fault(method: str, path: str) -> str | None:
        return "stall" if stalling.is_set() and method == "GET" and path.endswith(big) \
            else None

    with TokenProxy(registry.host, fault=fault) as proxy, \
            networked_daemon("crishim-stall", *module_network("stall"),
                             CONFIG) as nd:
        d = nd.d
        ref = f"{proxy.host}/stall/app:v1"
        empty = store(d)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            pull(d, ref)
        elapsed = time.monotonic() - started
        # The proxy sent 64 KiB of the layer and then nothing: cancelled after 3 s of that.
        assert TIMEOUT <= elapsed < TIMEOUT + 10, elapsed
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        msg = err.value.details() or ""
        for part in (ref, proxy.host, f"layer {big}", "65536 of", "3s",
                     "registry.image_pull_progress_timeout"):
            assert part in msg, msg
        # Nothing stays: no image, no layer (the base layer that did arrive goes too), no
        # temp dir, no blob; and crishim hung up on the stalled connection.
        assert store(d) == empty
        wait_for(lambda: proxy.dropped >= 1, 10, "crishim to close the stalled connection")

        stalling.clear()  # the registry heals: the same pull starts afresh and works
        n = len(proxy.requests)
        assert pull(d, ref) == img.image_id
        assert any(p.endswith(big) for _m, p, _a in proxy.requests[n:])
        after = store(d)
        assert after["listed"] == [img.image_id] and len(after["layers"]) == 2
        assert after["tmp"] == []

        env = DurabilityEnv(d, nd.tmpdir, nd.bridge, ref, nd.config)
        pod, pod_cfg = env.run_pod("stallpod")
        cid = env.container(pod, pod_cfg, "app", ["sh", "-c", "wc -c < /stall"])
        st = wait_for(lambda: (s := env.container_status(cid)).state == pb.CONTAINER_EXITED
                      and s, 30, "the container to exit")
        assert st.exit_code == 0, st
        with open(os.path.join(pod_cfg.log_directory, "app.log")) as fh:
            assert fh.read().split()[-1] == str(1 << 20)
        env.remove_all()


def test_registry_that_answers_nothing_ends_the_pull(registry: Registry) -> None:
    """Connection accepted, request read, not one byte back (not even headers)."""
    img = ib.build_busybox(extra_layers=[[ib.file("silent", "s")]])
    ib.push_image(registry.host, "stall/silent", "v1", img)

    def fault(method: str, path: str) -> str | None:
        return "silent" if "/manifests/" in path else None

    with TokenProxy(registry.host, fault=fault) as proxy, running_daemon(CONFIG) as d:
        ref = f"{proxy.host}/stall/silent:v1"
        empty = store(d)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            pull(d, ref)
        assert time.monotonic() - started < TIMEOUT + 10
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        msg = err.value.details() or ""
        assert "manifest v1" in msg and proxy.host in msg and "0 bytes received" in msg, msg
        assert store(d) == empty
        wait_for(lambda: proxy.dropped >= 1, 10, "crishim to close the silent connection")


def test_slow_pull_that_keeps_receiving_is_not_cancelled(registry: Registry) -> None:
    img = big_image("slow")
    ib.push_image(registry.host, "stall/slow", "v1", img)
    big = img.layers[1].digest

    def fault(method: str, path: str) -> str | None:
        return "slow" if method == "GET" and path.endswith(big) else None

    # 8 pieces 1 s apart: the layer takes ~7 s, more than twice the 3 s timeout, but
    # bytes never stop for as long as the timeout.
    with TokenProxy(registry.host, fault=fault, trickle=(8, 1.0)) as proxy, \
            running_daemon(CONFIG) as d:
        started = time.monotonic()
        assert pull(d, f"{proxy.host}/stall/slow:v1", timeout=120) == img.image_id
        assert time.monotonic() - started > 2 * TIMEOUT
        assert store(d)["tmp"] == []
