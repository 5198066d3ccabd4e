"""hosts.toml mirrors, and pulls that meet a broken network or registry: corrupt blobs,
5xx answers, dropped connections, a daemon killed mid-pull."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e import imagebuild as ib
from tests.e2e.daemon import Daemon, running_daemon
from tests.e2e.registry import Registry, TokenProxy, free_port


def pull(d: Daemon, ref: str, timeout: float = 60) -> str:
    return str(d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)),
                                    timeout=timeout).image_ref)


def images_state(d: Daemon) -> tuple[list[str], list[str], list[str]]:
    base = os.path.join(d.root, "images")
    return (sorted(i.id for i in d.images().ListImages(pb.ListImagesRequest()).images),
            sorted(os.listdir(os.path.join(base, "layers"))),
            sorted(os.listdir(os.path.join(base, "tmp"))))


@pytest.fixture
def certs_d() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="crishim-certs-") as d:
        yield d


def write_hosts(certs_d: str, host: str, text: str) -> None:
    os.makedirs(os.path.join(certs_d, host), exist_ok=True)
    with open(os.path.join(certs_d, host, "hosts.toml"), "w") as fh:
        fh.write(text)


def test_mirror_without_route_to_upstream(registry: Registry, certs_d: str) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("mirror", "m")]])
    ib.push_image(registry.host, "pause", "3.9", img)
    dead = f"127.0.0.1:{free_port()}"  # a mirror that refuses connections comes first
    write_hosts(certs_d, "registry.k8s.io", f'''
server = "https://registry.k8s.io"
[host."http://{dead}"]
  capabilities = ["pull", "resolve"]
[host."http://{registry.host}"]
  capabilities = ["pull", "resolve"]
''')
    # Only the mirror is reachable: registry.k8s.io itself must never be needed.
    with running_daemon(f'[registry]\nconfig_path = "{certs_d}"\n') as d:
        assert pull(d, "registry.k8s.io/pause:3.9") == img.image_id
        st = d.images().ImageStatus(pb.ImageStatusRequest(
            image=pb.ImageSpec(image="registry.k8s.io/pause:3.9"))).image
        assert list(st.repo_tags) == ["registry.k8s.io/pause:3.9"]
        assert st.repo_digests[0].startswith("registry.k8s.io/pause@sha256:")


def test_server_override_plain_http(registry: Registry, certs_d: str) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("srv", "s")]])
    ib.push_image(registry.host, "lib/app", "v1", img)
    write_hosts(certs_d, "registry.example.invalid", f'server = "http://{registry.host}"\n')
    with running_daemon(f'[registry]\nconfig_path = "{certs_d}"\n') as d:
        assert pull(d, "registry.example.invalid/lib/app:v1") == img.image_id


def test_corrupt_blob_fails_and_stores_nothing(registry: Registry) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("corrupt", "c" * 10000)]])
    ib.push_image(registry.host, "fault/corrupt", "v1", img)
    bad = img.layers[1].digest

    def fault(method: str, path: str) -> str | None:
        return "corrupt" if method == "GET" and path.endswith(bad) else None

    with TokenProxy(registry.host, fault=fault) as proxy, running_daemon("") as d:
        with pytest.raises(grpc.RpcError) as exc:
            pull(d, f"{proxy.host}/fault/corrupt:v1")
        # The registry served other content than the image names: not crishim's fault.
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "digest" in (exc.value.details() or "")
        assert images_state(d) == ([], [], [])


def test_retries_5xx_and_dropped_connections(registry: Registry) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("retry", "r" * 100000)]])
    ib.push_image(registry.host, "fault/retry", "v1", img)
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def fault(method: str, path: str) -> tuple[int, bytes] | str | None:
        with lock:
            seen[path] = seen.get(path, 0) + 1
            n = seen[path]
        if "/manifests/" in path and n == 1:
            return (503, b"busy")
        if "/blobs/" in path and n == 1:
            return "truncate"  # connection dropped halfway through the body
        if "/blobs/" in path and n == 2:
            return (502, b"bad gateway")
        return None

    with TokenProxy(registry.host, fault=fault) as proxy, running_daemon("") as d:
        assert pull(d, f"{proxy.host}/fault/retry:v1") == img.image_id
        assert images_state(d)[2] == []


def test_killed_mid_pull_leaves_nothing_and_is_cleaned(registry: Registry) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("slow", os.urandom(1 << 20))]])
    ib.push_image(registry.host, "fault/slow", "v1", img)
    slow = img.layers[1].digest
    release = threading.Event()

    def fault(method: str, path: str) -> str | None:
        if path.endswith(slow):
            release.wait(30)  # hold this layer until the daemon was killed
        return None

    with TokenProxy(registry.host, fault=fault) as proxy, running_daemon("") as d:
        ref = f"{proxy.host}/fault/slow:v1"
        errors: list[BaseException] = []

        def doomed_pull() -> None:
            try:
                pull(d, ref)
            except grpc.RpcError as exc:  # the daemon dies under it
                errors.append(exc)

        t = threading.Thread(target=doomed_pull)
        t.start()
        deadline = time.monotonic() + 20
        tmp = os.path.join(d.root, "images", "tmp")
        while time.monotonic() < deadline and not any(p.endswith(slow) for _m, p, _a in
                                                      proxy.requests):
            time.sleep(0.05)
        time.sleep(0.3)  # let the base layer land and the slow one start its temp dir
        assert os.listdir(tmp), "a pull in progress keeps its data in images/tmp"
        d.kill9()
        release.set()
        t.join(60)
        assert not t.is_alive(), "the pull did not return within 60s"
        assert errors
        d.start()
        ids, layers, tmp_left = images_state(d)
        assert ids == [] and tmp_left == [] and layers == []
        assert pull(d, ref) == img.image_id  # and a new pull works
        info = json.loads(d.images().ImageStatus(pb.ImageStatusRequest(
            image=pb.ImageSpec(image=ref), verbose=True)).info["info"])
        assert len(info["layerDirs"]) == len(img.layers), info
        assert all(os.path.isdir(p) for p in info["layerDirs"])


def test_blob_redirects_are_followed(registry: Registry) -> None:
    """Registries often answer blob GETs with a redirect to object storage."""
    img = ib.build_busybox(extra_layers=[[ib.file("redirect", "r")]])
    ib.push_image(registry.host, "fault/redirect", "v1", img)

    def fault(method: str, path: str) -> tuple[int, bytes, dict[str, str]] | None:
        if method == "GET" and "/blobs/" in path:
            return (307, b"", {"Location": f"{registry.url}{path}"})
        return None

    with TokenProxy(registry.host, fault=fault) as proxy, running_daemon("") as d:
        assert pull(d, f"{proxy.host}/fault/redirect:v1") == img.image_id
        assert any("/blobs/" in p for _m, p, _a in proxy.requests)


def test_sigterm_during_pull_exits_cleanly(registry: Registry) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("term", os.urandom(1 << 20))]])
    ib.push_image(registry.host, "fault/term", "v1", img)
    slow = img.layers[1].digest
    release = threading.Event()

    def fault(method: str, path: str) -> str | None:
        if path.endswith(slow):
            release.wait(60)
        return None

    # drain_timeout: in-flight RPCs get 1 s before shutdown goes on (keeps the test short)
    with TokenProxy(registry.host, fault=fault) as proxy, \
            running_daemon("drain_timeout = 1.0\n") as d:
        ref = f"{proxy.host}/fault/term:v1"
        t = threading.Thread(target=lambda: _ignore_rpc_error(pull, d, ref))
        t.start()
        while not any(p.endswith(slow) for _m, p, _a in proxy.requests):
            time.sleep(0.05)
        assert d.proc is not None
        code = d.stop()  # SIGTERM; it would be SIGKILLed (-9) if a thread hung the exit
        release.set()
        t.join(60)
        assert not t.is_alive(), "the pull did not return within 60s"
        assert code == 0, d.logs()
        assert not os.listdir(os.path.join(d.root, "images", "tmp"))
        d.start()  # so that running_daemon can stop it again


def _ignore_rpc_error(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except grpc.RpcError:
        pass
