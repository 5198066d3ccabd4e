"""The daemon itself against a real process: CRI basics, socket safety and lifecycle."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.cni import cni_conf_dir
from tests.e2e.daemon import Daemon, running_daemon, write_config
from tests.e2e.registry import Registry, TokenProxy

# The kubelet's limit; the daemon must refuse larger messages and keep serving.
MAX_MESSAGE = 16 * 1024 * 1024


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string of plain paths is a valid TOML basic string


Spawn = Callable[..., Daemon]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """spawn(config="", cls=Daemon, start=True): a daemon of the test's own, stopped and
    removed afterwards. start=False lets the test write files into its workdir first."""
    made: list[Daemon] = []

    def make(config: str = "", cls: type[Daemon] = Daemon, start: bool = True) -> Daemon:
        workdir = tempfile.mkdtemp(prefix="crishim-fnd-")
        d = cls(workdir=workdir, config_file=os.path.join(workdir, "crishim.toml"))
        write_config(d.config_file, config)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in made:
        if d.proc is not None:
            d.stop(signal.SIGKILL)
        shutil.rmtree(d.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def net_dir() -> Iterator[str]:
    tmp = tempfile.mkdtemp(prefix="crishim-fnd-cni-")
    # Only a config file: Status reads it, no bridge is ever created for it.
    yield cni_conf_dir(tmp, "fnd", "crfnd0", "10.123.0.0/24")
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(net_dir: str) -> Iterator[Daemon]:
    """One daemon for the read-only checks, with a valid CNI config."""
    with running_daemon(f"[cni]\nconf_dir = {toml_str(net_dir)}\n") as d:
        yield d
    shutil.rmtree(d.workdir, ignore_errors=True)


def conditions(resp: pb.StatusResponse) -> dict[str, pb.RuntimeCondition]:
    return {c.type: c for c in resp.status.conditions}


def assert_serving(d: Daemon) -> None:
    assert d.proc is not None and d.proc.poll() is None, d.logs()
    assert d.runtime().Version(pb.VersionRequest(), timeout=5).runtime_name == "crishim"


# --- CRI basics -----------------------------------------------------------------------

def test_version(shared: Daemon) -> None:
    v = shared.runtime().Version(pb.VersionRequest(version="v1"), timeout=5)
    assert v.version == "0.1.0"
    assert v.runtime_name == "crishim"
    assert v.runtime_version
    assert v.runtime_api_version == "v1"


def test_grpcio_server_serves_the_same_calls(net_dir: str) -> None:
    """grpc_server = "grpcio", the alternative to crishim's own server: the same answers,
    statuses and streams."""
    with running_daemon(f'grpc_server = "grpcio"\n[cni]\nconf_dir = {toml_str(net_dir)}\n'
                        ) as d:
        assert_serving(d)
        rt = d.runtime()
        assert list(rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=5).items) == []
        with pytest.raises(grpc.RpcError) as err:
            rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id="nope"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "grpc_server=grpcio" in d.logs()


def test_status_ready_with_valid_cni_config(shared: Daemon) -> None:
    resp = shared.runtime().Status(pb.StatusRequest(), timeout=5)
    conds = conditions(resp)
    assert conds["RuntimeReady"].status is True
    assert conds["NetworkReady"].status is True, conds["NetworkReady"].message
    assert resp.info == {}  # only verbose requests carry info
    assert "runc" in {h.name for h in resp.runtime_handlers}


def test_status_verbose_has_config_and_versions(shared: Daemon, net_dir: str) -> None:
    resp = shared.runtime().Status(pb.StatusRequest(verbose=True), timeout=15)
    config = json.loads(resp.info["config"])
    assert config["cni"]["conf_dir"] == net_dir
    assert config["root"] == shared.root and config["state"] == shared.state
    versions = json.loads(resp.info["versions"])
    assert versions["crishim"]
    assert "runc version" in versions["runc"]
    assert "conmon version" in versions["conmon"]
    cni = json.loads(resp.info["cniconfig"])
    assert cni["config"]["name"] == "fnd"
    assert set(cni["plugins"]) == {"bridge", "portmap"}


def test_network_not_ready_without_cni_config(spawn: Spawn) -> None:
    d = spawn(start=False)
    empty = os.path.join(d.workdir, "empty-net.d")
    os.mkdir(empty)
    write_config(d.config_file, f"[cni]\nconf_dir = {toml_str(empty)}\n")
    d.start()
    cond = conditions(d.runtime().Status(pb.StatusRequest(), timeout=5))["NetworkReady"]
    assert cond.status is False
    assert cond.reason == "NetworkPluginNotReady"
    assert f"no network config found in {empty}" in cond.message
    # Dropping a config in is picked up without a restart.
    cni_conf_dir(d.workdir, "late", "crlate0", "10.124.0.0/24")
    conf = os.path.join(d.workdir, "cni-conf", "10-late.conflist")
    shutil.copy(conf, empty)
    assert conditions(d.runtime().Status(pb.StatusRequest(), timeout=5))[
        "NetworkReady"].status is True


def test_network_not_ready_when_plugin_missing(spawn: Spawn) -> None:
    d = spawn(start=False)
    conf_dir = cni_conf_dir(d.workdir, "nobin", "crnobin0", "10.125.0.0/24")
    no_bins = os.path.join(d.workdir, "no-plugins")
    os.mkdir(no_bins)
    write_config(d.config_file, f"[cni]\nconf_dir = {toml_str(conf_dir)}\n"
                                f"bin_dirs = [{toml_str(no_bins)}]\n")
    d.start()
    cond = conditions(d.runtime().Status(pb.StatusRequest(), timeout=5))["NetworkReady"]
    assert cond.status is False
    assert cond.reason == "NetworkPluginNotReady"
    assert "plugin 'bridge' not found" in cond.message


def test_runtime_not_ready_when_runtime_binary_missing(spawn: Spawn) -> None:
    d = spawn('default_runtime = "ghost"\n'
              '[runtimes.ghost]\npath = "/nonexistent/ghost-runtime"\n')
    cond = conditions(d.runtime().Status(pb.StatusRequest(), timeout=5))["RuntimeReady"]
    assert cond.status is False
    assert "/nonexistent/ghost-runtime" in cond.message


def test_runtime_config_reports_cgroup_driver(shared: Daemon) -> None:
    resp = shared.runtime().RuntimeConfig(pb.RuntimeConfigRequest(), timeout=5)
    expected = (pb.CgroupDriver.SYSTEMD if os.path.isdir("/run/systemd/system")
                else pb.CgroupDriver.CGROUPFS)
    assert resp.linux.cgroup_driver == expected


def test_runtime_config_follows_configured_driver(spawn: Spawn) -> None:
    d = spawn('cgroup_driver = "cgroupfs"\n')
    resp = d.runtime().RuntimeConfig(pb.RuntimeConfigRequest(), timeout=5)
    assert resp.linux.cgroup_driver == pb.CgroupDriver.CGROUPFS


def _update_cidr(d: Daemon, cidr: str) -> None:
    d.runtime().UpdateRuntimeConfig(pb.UpdateRuntimeConfigRequest(
        runtime_config=pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr=cidr))),
        timeout=5)


def _pod_cidr(d: Daemon) -> str:
    info = d.runtime().Status(pb.StatusRequest(verbose=True), timeout=15).info
    return str(json.loads(info["podCIDR"]))


def test_update_runtime_config_stores_cidr(spawn: Spawn) -> None:
    d = spawn()
    _update_cidr(d, "10.244.1.0/24,fd00:10:244:1::/64")
    assert _pod_cidr(d) == "10.244.1.0/24,fd00:10:244:1::/64"
    with pytest.raises(grpc.RpcError) as err:
        _update_cidr(d, "10.244.1.0/33")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "10.244.1.0/33" in (err.value.details() or "")
    # The bad request changed nothing, and the stored CIDR survives a restart.
    assert _pod_cidr(d) == "10.244.1.0/24,fd00:10:244:1::/64"
    assert d.stop() == 0
    d.start()
    assert _pod_cidr(d) == "10.244.1.0/24,fd00:10:244:1::/64"


# --- malformed and unknown calls --------------------------------------------------------

def test_checkpoint_of_an_unknown_container_is_not_found(shared: Daemon) -> None:
    # Every RPC of the CRI is served (none answers UNIMPLEMENTED by omission).
    with pytest.raises(grpc.RpcError) as err:
        shared.runtime().CheckpointContainer(
            pb.CheckpointContainerRequest(container_id="x", location="/tmp/x.tar"),
            timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "x" in (err.value.details() or "")


def test_unknown_method_is_unimplemented(shared: Daemon) -> None:
    with shared.channel() as ch:
        call = ch.unary_unary("/runtime.v1.RuntimeService/NoSuchMethod", None, None)
        with pytest.raises(grpc.RpcError) as err:
            call(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert_serving(shared)


def test_undecodable_request_is_an_error(shared: Daemon) -> None:
    with shared.channel() as ch:
        call = ch.unary_unary("/runtime.v1.RuntimeService/Version", None, None)
        with pytest.raises(grpc.RpcError) as err:
            call(b"\xff\xff\xff\xff", timeout=5)  # not a valid protobuf encoding
    assert err.value.code() != grpc.StatusCode.OK
    assert_serving(shared)


def _read_until_closed(sock: socket.socket, limit: float = 10.0) -> bytes:
    sock.settimeout(limit)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def _frame_types(data: bytes) -> list[int]:
    types = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        types.append(data[3])
        data = data[9 + length:]
    return types


def test_garbage_bytes_close_the_connection(shared: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(shared.socket)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + secrets.token_bytes(4096))
        _read_until_closed(s)  # the server hangs up instead of hanging
    assert_serving(shared)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def _h2_connect(sock_path: str, frames: bytes) -> socket.socket:
    """Connect, send the HTTP/2 preface (+ empty SETTINGS) and then `frames`."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(0x4, 0, 0, b"")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    s.sendall(preface + frames)
    return s


def test_oversized_http2_frame_closes_the_connection(shared: Daemon) -> None:
    # A HEADERS frame announcing 16 MiB - 1 bytes, far beyond the 16 KiB frame size the
    # server allows: a connection error, so the server hangs up.
    header = (0xFFFFFF).to_bytes(3, "big") + bytes([0x1, 0x4]) + struct.pack(">I", 1)
    with _h2_connect(shared.socket, header + b"x" * 100) as s:
        reply = _read_until_closed(s)
    assert _frame_types(reply)[:1] == [0x4]  # it spoke HTTP/2 (SETTINGS) before closing
    assert_serving(shared)


def test_garbage_headers_frame_gets_a_grpc_status(shared: Daemon) -> None:
    # An undecodable header block on stream 1: that call fails with a gRPC status.
    headers = _frame(0x1, 0x5, 1, b"\xff\xff\xff\xff\xff")  # END_STREAM | END_HEADERS
    with _h2_connect(shared.socket, headers) as s:
        s.settimeout(10)
        reply = b""
        while b"grpc-status" not in reply:
            chunk = s.recv(65536)
            assert chunk, f"connection closed without a status: {reply!r}"
            reply += chunk
    assert b"grpc-status" in reply
    assert_serving(shared)


def test_oversized_message_is_refused(shared: Daemon) -> None:
    huge = pb.VersionRequest(version="x" * (MAX_MESSAGE + 1024))
    with pytest.raises(grpc.RpcError) as err:
        shared.runtime().Version(huge, timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_serving(shared)


# --- socket and process lifecycle --------------------------------------------------------

@dataclass
class NestedSocketDaemon(Daemon):
    """Listens in a directory the daemon has to create itself."""

    @property
    def socket(self) -> str:
        return os.path.join(self.workdir, "run", "crishim.sock")


def test_socket_and_parent_dir_modes(spawn: Spawn) -> None:
    d = spawn(cls=NestedSocketDaemon)
    st = os.stat(d.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert stat.S_IMODE(os.stat(os.path.dirname(d.socket)).st_mode) == 0o711


def test_stale_socket_is_replaced(spawn: Spawn) -> None:
    d = spawn(start=False)
    # What a SIGKILLed daemon leaves behind: a socket file nobody listens on.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(d.socket)
    assert os.path.exists(d.socket)
    d.start()
    assert_serving(d)
    # And the same after a real crash.
    d.kill9()
    assert os.path.exists(d.socket)
    d.start()
    assert_serving(d)


def _second_instance(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)


def test_second_instance_on_same_state_fails(spawn: Spawn) -> None:
    d = spawn()
    res = _second_instance(d.args())
    assert res.returncode != 0
    assert f"another crishim is running with state dir {d.state}" in res.stderr
    assert_serving(d)


def test_second_instance_on_same_socket_fails(spawn: Spawn) -> None:
    d = spawn()
    other = os.path.join(d.workdir, "other")
    args = d.args()
    args[args.index("--root") + 1] = os.path.join(other, "root")
    args[args.index("--state") + 1] = os.path.join(other, "state")
    res = _second_instance(args)
    assert res.returncode != 0
    assert f"socket {d.socket} is served by another process" in res.stderr
    assert_serving(d)


def test_sigterm_exits_zero_and_removes_socket(spawn: Spawn) -> None:
    d = spawn()
    assert d.stop(signal.SIGTERM) == 0
    assert not os.path.exists(d.socket)
    assert "stopped" in d.logs()


@contextlib.contextmanager
def _sigterm_during_slow_pull(spawn: Spawn, registry: Registry, busybox_ref: str,
                              trickle: tuple[int, float], drain: float,
                              ) -> Iterator[tuple[Daemon, grpc.Future[Any]]]:
    """SIGTERM a daemon while a PullImage is in flight: the registry sends each blob in
    `trickle` = (pieces, seconds between them), so the call takes as long as that."""
    in_flight = threading.Event()

    def fault(method: str, path: str) -> str | None:
        if method == "GET" and "/blobs/" in path:
            in_flight.set()
            return "slow"
        return None

    with TokenProxy(registry.host, fault=fault, trickle=trickle) as proxy:
        d = spawn(f"drain_timeout = {drain}\n")
        ref = proxy.host + busybox_ref.removeprefix(registry.host)
        future = d.images().PullImage.future(
            pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=60)
        assert in_flight.wait(20), "the pull did not reach the registry's blobs"
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        yield d, future


def test_sigterm_finishes_in_flight_call(spawn: Spawn, registry: Registry,
                                         busybox_ref: str) -> None:
    # Each blob takes ~2s; the drain allows 10s: the pull ends with its own answer.
    with _sigterm_during_slow_pull(spawn, registry, busybox_ref, (3, 1.0), drain=10) as (
            d, future):
        assert d.proc is not None
        assert future.result().image_ref.startswith("sha256:")
        assert d.proc.wait(timeout=15) == 0
        assert not os.path.exists(d.socket)


def test_sigterm_drain_is_bounded(spawn: Spawn, registry: Registry, busybox_ref: str) -> None:
    # The pull would take 20s or more but the drain allows 1s: the daemon still exits
    # promptly, cutting the call off.
    with _sigterm_during_slow_pull(spawn, registry, busybox_ref, (21, 1.0), drain=1) as (
            d, future):
        assert d.proc is not None
        with pytest.raises(grpc.RpcError) as err:
            future.result()
        assert err.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        # Exits within the drain plus start/stop overhead, well before the call would end.
        assert d.proc.wait(timeout=15) == 0


def test_systemd_notify_ready_and_stopping(spawn: Spawn, monkeypatch: pytest.MonkeyPatch) -> None:
    # systemd/crishim.service is Type=notify: READY=1 must come once the socket serves.
    d = spawn(start=False)
    notify_path = os.path.join(d.workdir, "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        notify.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", notify_path)
        d.start()
        assert notify.recv(4096) == b"READY=1"
        assert_serving(d)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        assert notify.recv(4096) == b"STOPPING=1"
        assert d.proc.wait(timeout=30) == 0
