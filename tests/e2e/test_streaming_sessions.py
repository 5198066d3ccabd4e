"""Exec, attach and port-forward end to end: real daemon, runc, conmon, CNI, busybox.

The clients are crishim.streaming.client (SPDY/3.1 like kubectl/crictl, and WebSocket);
they talk to the URLs the CRI Exec/Attach/PortForward RPCs return.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.streaming.client import (
    SpdyPortForward,
    UpgradeFailed,
    exec_spdy,
    exec_websocket,
    websocket_portforward,
)
from tests.e2e.cni import module_network
from tests.e2e.lifecycle import (
    Env,
    container,
    daemon_env,
    exec_sync,
    pod,
    wait_exited,
)
from tests.e2e.registry import Registry

HTTPD_PORT = 8080
BIG = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    with daemon_env(registry, busybox_ref, "crishim-stream",
                    *module_network("streaming")) as e:
        yield e


@pytest.fixture(scope="module")
def sleeper(env: Env) -> Iterator[tuple[str, str]]:
    """(pod id, container id) of a running container to exec into."""
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "sleeper", ["sleep", "3600"])
        yield pod_id, cid


def exec_url(env: Env, cid: str, cmd: list[str], **kw: bool) -> str:
    req = pb.ExecRequest(container_id=cid, cmd=cmd, **{"stdout": True, **kw})
    return str(env.rt().Exec(req, timeout=10).url)


def run(coro: object, timeout: float = 30) -> object:
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [0, 7])
def test_exec_exit_code_spdy_and_websocket(env: Env, sleeper: tuple[str, str],
                                           code: int) -> None:
    _, cid = sleeper
    cmd = ["sh", "-c", f"echo hello; echo oops >&2; exit {code}"]
    res = run(exec_spdy(exec_url(env, cid, cmd, stderr=True)))
    assert (res.stdout, res.stderr, res.exit_code) == (b"hello\n", b"oops\n", code)  # type: ignore[attr-defined]
    assert res.protocol == "v4.channel.k8s.io"  # type: ignore[attr-defined]
    res = run(exec_websocket(exec_url(env, cid, cmd, stderr=True)))
    assert (res.stdout, res.stderr, res.exit_code) == (b"hello\n", b"oops\n", code)  # type: ignore[attr-defined]


def test_exec_tty_with_resize(env: Env, sleeper: tuple[str, str]) -> None:
    _, cid = sleeper
    # Bounded by the client timeout: loops until the resize reached the container's tty.
    script = 'while [ "$(stty size)" != "45 123" ]; do sleep 0.1; done; stty size; exit 3'
    for proto in ("spdy", "websocket"):
        url = exec_url(env, cid, ["sh", "-c", script], tty=True)
        if proto == "spdy":
            res = run(exec_spdy(url, tty=True, stderr=False, resize=[(123, 45)]))
        else:
            res = run(exec_websocket(url, resize=[(123, 45)]))
        assert b"45 123" in res.stdout, proto  # type: ignore[attr-defined]
        assert res.exit_code == 3  # type: ignore[attr-defined]


def test_exec_stdin_round_trip(env: Env, sleeper: tuple[str, str]) -> None:
    _, cid = sleeper
    payload = os.urandom(150 * 1024).hex().encode()  # 300 KiB: several flow-control windows
    res = run(exec_spdy(exec_url(env, cid, ["cat"], stdin=True), stdin=payload,
                        stderr=False))
    assert res.stdout == payload and res.exit_code == 0  # type: ignore[attr-defined]
    res = run(exec_websocket(exec_url(env, cid, ["cat"], stdin=True), stdin=b"ws-stdin\n"))
    assert res.stdout == b"ws-stdin\n"  # type: ignore[attr-defined]


def test_exec_dies_when_client_goes_away(env: Env) -> None:
    # Its own pid namespace: the container's init is `sleep`, which never reaps, so an
    # exec'd process orphaned to it (runc killed along with it) would stay a zombie.
    own_pid = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=pb.NamespaceOption(pid=pb.CONTAINER)))
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "own-pid", ["sleep", "3600"], linux=own_pid)
        url = exec_url(env, cid, ["sleep", "4242"])

        def running() -> bool:
            return "4242" in exec_sync(env, cid, ["ps"]).stdout.decode()

        async def leave_early() -> bool:
            task = asyncio.create_task(exec_spdy(url, stderr=False))
            # Cancelled only once the exec is seen running: else the test would pass for
            # an exec that never started.
            seen = False
            deadline = time.monotonic() + 10
            while not seen and not task.done() and time.monotonic() < deadline:
                seen = await asyncio.to_thread(running)
                await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return seen

        assert run(leave_early()), "the exec was never seen running"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ps = exec_sync(env, cid, ["ps"]).stdout.decode()
            if "4242" not in ps:
                break
            time.sleep(0.2)
        assert "4242" not in ps
        # Reaped by runc: no zombie "sleep" beside the container's own.
        sleeps = exec_sync(env, cid, ["sh", "-c", "cat /proc/[0-9]*/comm | grep -cx sleep"])
        assert sleeps.stdout.strip() == b"1"


def test_replayed_or_guessed_token_gets_404_and_nothing_runs(
        env: Env, sleeper: tuple[str, str]) -> None:
    _, cid = sleeper
    url = exec_url(env, cid, ["sh", "-c", "echo run >> /tmp/runs"])
    assert run(exec_spdy(url)).exit_code == 0  # type: ignore[attr-defined]
    guessed = url.rsplit("/", 1)[0] + "/" + "A" * 32
    for bad in (url, guessed):
        with pytest.raises(UpgradeFailed) as exc:
            run(exec_spdy(bad))
        assert exc.value.status == 404
        with pytest.raises(UpgradeFailed) as exc:
            run(exec_websocket(bad))
        assert exc.value.status == 404
    assert exec_sync(env, cid, ["cat", "/tmp/runs"]).stdout == b"run\n"


def test_request_validation(env: Env, sleeper: tuple[str, str]) -> None:
    _, cid = sleeper
    rt = env.rt()
    cases = [
        (pb.ExecRequest(container_id=cid, cmd=["ls"], tty=True, stdout=True, stderr=True),
         grpc.StatusCode.INVALID_ARGUMENT, "tty and stderr cannot both be true"),
        (pb.ExecRequest(container_id=cid, cmd=["ls"]), grpc.StatusCode.INVALID_ARGUMENT,
         "one of stdin, stdout, or stderr"),
        (pb.ExecRequest(container_id="nope", cmd=["ls"], stdout=True),
         grpc.StatusCode.NOT_FOUND, ""),
    ]
    for req, code, text in cases:
        with pytest.raises(grpc.RpcError) as exc:
            rt.Exec(req, timeout=10)
        assert exc.value.code() == code and text in exc.value.details()
    with pytest.raises(grpc.RpcError) as exc:
        rt.Attach(pb.AttachRequest(container_id=cid, tty=True, stdout=True, stderr=True),
                  timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as exc:
        rt.PortForward(pb.PortForwardRequest(pod_sandbox_id="nope", port=[80]), timeout=10)
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND


def test_exec_in_exited_container_is_failed_precondition(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "done", ["true"])
        wait_exited(env, cid)
        with pytest.raises(grpc.RpcError) as exc:
            env.rt().Exec(pb.ExecRequest(container_id=cid, cmd=["ls"], stdout=True),
                          timeout=10)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_attach_to_a_printing_container(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        # Prints for a while after a head start that leaves time to attach, then exits.
        script = "sleep 1; for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 0.2; done"
        cid = container(env, pod_id, pod_cfg, "printer", ["sh", "-c", script])
        url = env.rt().Attach(pb.AttachRequest(container_id=cid, stdout=True, stderr=True),
                              timeout=10).url
        res = run(exec_spdy(url))
        assert b"line 8\n" in res.stdout  # type: ignore[attr-defined]
        assert res.exit_code == 0  # type: ignore[attr-defined]


def test_attach_stdin_round_trip(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "catter", ["cat"], stdin=True, stdin_once=True)
        url = env.rt().Attach(pb.AttachRequest(container_id=cid, stdin=True, stdout=True,
                                               stderr=True), timeout=10).url
        # stdin_once: our half-close ends the container's stdin, so cat (and attach) end.
        res = run(exec_spdy(url, stdin=b"through conmon\n"))
        assert res.stdout == b"through conmon\n"  # type: ignore[attr-defined]
        wait_exited(env, cid)


@pytest.fixture(scope="module")
def httpd_pod(env: Env) -> Iterator[str]:
    with pod(env) as (pod_id, pod_cfg):
        script = (f"mkdir -p /www && echo hello-from-pod > /www/index.html && "
                  f"head -c {BIG} /dev/urandom > /www/big && "
                  f"exec httpd -f -p {HTTPD_PORT} -h /www")
        cid = container(env, pod_id, pod_cfg, "httpd", ["sh", "-c", script])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # httpd listening?
            r = exec_sync(env, cid, ["wget", "-q", "-O", "-",
                                     f"http://127.0.0.1:{HTTPD_PORT}/"])
            if r.exit_code == 0:
                break
            time.sleep(0.2)
        yield pod_id


def pf_url(env: Env, pod_id: str) -> str:
    return str(env.rt().PortForward(pb.PortForwardRequest(pod_sandbox_id=pod_id,
                                                          port=[HTTPD_PORT]), timeout=10).url)


GET = b"GET /index.html HTTP/1.0\r\nHost: pod\r\n\r\n"


@pytest.mark.parametrize("tunnel", [False, True], ids=["spdy", "spdy-over-websocket"])
def test_port_forward_to_httpd_spdy_20_concurrent(env: Env, httpd_pod: str,
                                                  tunnel: bool) -> None:
    async def go() -> list[tuple[bytes, bytes]]:
        url = pf_url(env, httpd_pod)
        pf = await (SpdyPortForward.connect_tunnel(url) if tunnel
                    else SpdyPortForward.connect(url))
        try:
            return await asyncio.gather(*(pf.request(HTTPD_PORT, GET) for _ in range(20)))
        finally:
            await pf.close()

    answers = run(go(), timeout=60)
    assert len(answers) == 20  # type: ignore[arg-type]
    for data, err in answers:  # type: ignore[attr-defined]
        assert data.startswith(b"HTTP/1.") and b"200" in data.split(b"\r\n")[0]
        assert data.endswith(b"hello-from-pod\n") and err == b""


def test_port_forward_to_httpd_websocket(env: Env, httpd_pod: str) -> None:
    data, err = run(websocket_portforward(pf_url(env, httpd_pod), HTTPD_PORT, GET))  # type: ignore[misc]
    assert data.endswith(b"hello-from-pod\n") and err == b""


def test_port_forward_to_closed_port_reports_error(env: Env, httpd_pod: str) -> None:
    async def go() -> tuple[bytes, bytes]:
        pf = await SpdyPortForward.connect(pf_url(env, httpd_pod))
        try:
            return await pf.request(9, b"x")
        finally:
            await pf.close()

    data, err = run(go())  # type: ignore[misc]
    assert data == b"" and b"error forwarding port 9" in err


def test_exec_interactive_shell_with_tty(env: Env, sleeper: tuple[str, str]) -> None:
    _, cid = sleeper
    # What `crictl exec -it sh` does: typed lines reach the shell, its exit code comes back.
    url = exec_url(env, cid, ["sh"], tty=True, stdin=True)
    res = run(exec_spdy(url, stdin=b"echo $((6*7))x\nexit 5\n", tty=True, stderr=False,
                        resize=[(100, 30)]))
    assert b"42x" in res.stdout  # type: ignore[attr-defined]
    assert res.exit_code == 5  # type: ignore[attr-defined]


def test_attach_with_tty_stdin_and_resize(env: Env) -> None:
    with pod(env) as (pod_id, pod_cfg):
        cid = container(env, pod_id, pod_cfg, "shell", ["sh"], stdin=True, tty=True)
        url = env.rt().Attach(pb.AttachRequest(container_id=cid, stdin=True, stdout=True,
                                               tty=True), timeout=10).url
        # The resize goes through conmon's control fifo; the loop waits until it landed.
        # `tr` makes the answer differ from the echoed command line.
        line = b'while [ "$(stty size)" != "45 123" ]; do sleep 0.1; done; ' \
               b"stty size | tr ' ' x; exit\n"
        res = run(exec_spdy(url, stdin=line, tty=True, stderr=False, resize=[(123, 45)]))
        assert b"45x123" in res.stdout  # type: ignore[attr-defined]
        wait_exited(env, cid)


def test_port_forward_large_downloads_in_parallel(env: Env, httpd_pod: str) -> None:
    # 4 x 3 MiB at once over one SPDY connection: far beyond the 64 KiB stream and session
    # windows, so WINDOW_UPDATE accounting in both directions is exercised.
    get_big = b"GET /big HTTP/1.0\r\n\r\n"

    async def go() -> list[tuple[bytes, bytes]]:
        pf = await SpdyPortForward.connect(pf_url(env, httpd_pod))
        try:
            return await asyncio.gather(*(pf.request(HTTPD_PORT, get_big) for _ in range(4)))
        finally:
            await pf.close()

    answers = run(go(), timeout=120)
    bodies = [data.split(b"\r\n\r\n", 1)[1] for data, _ in answers]  # type: ignore[attr-defined]
    assert bodies and all(len(b) == BIG for b in bodies)
    assert len(set(bodies)) == 1  # the same file every time
