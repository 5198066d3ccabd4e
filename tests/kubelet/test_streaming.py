"""kubectl exec / attach / port-forward as the kubelet serves them: the client talks SPDY
or WebSocket to the kubelet, the kubelet proxies to crishim's streaming URL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from crishim.streaming.client import (
    SpdyPortForward,
    exec_spdy,
    exec_websocket,
    websocket_portforward,
)
from tests.kubelet.node import Kubelet
from tests.kubelet.nodeenv import Node, ctr, pod
from tests.kubelet.streams import exec_url, kubelet_exec

HTTP_GET = b"GET /i HTTP/1.0\r\n\r\n"


@pytest.fixture(scope="module")
def streams(node: Node) -> Iterator[Kubelet]:
    k = node.kubelet
    k.write_manifest("streams", pod("streams", [
        ctr(node, "web", "mkdir -p /w && echo forwarded > /w/i && exec httpd -f -p 8080 -h /w",
            readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 1}),
        # stdinOnce: the attach's half-close ends cat, and so the attach session.
        ctr(node, "att-spdy", "exec cat", stdin=True, stdinOnce=True),
        ctr(node, "att-ws", "exec cat", stdin=True, stdinOnce=True),
    ], restartPolicy="Never"))
    k.wait_pod("streams", lambda p: all(
        c.get("state", {}).get("running") for c in p["status"].get("containerStatuses", [])
    ) and len(p["status"].get("containerStatuses", [])) == 3, 60, "all containers running")
    yield k
    k.remove_manifest("streams")


@pytest.mark.parametrize("websocket", [False, True], ids=["spdy", "websocket"])
def test_exec(streams: Kubelet, websocket: bool) -> None:
    res = kubelet_exec(streams, "streams", "web", "read x; echo got-$x; echo err >&2; exit 7",
                       websocket=websocket, stdin=b"ping\n")
    assert res.stdout == b"got-ping\n"
    assert res.stderr == b"err\n"
    assert res.exit_code == 7


@pytest.mark.parametrize("websocket", [False, True], ids=["spdy", "websocket"])
def test_attach(streams: Kubelet, websocket: bool) -> None:
    container = "att-ws" if websocket else "att-spdy"
    url = exec_url(streams, "streams", container, [], stdin=True, kind="attach")
    if websocket:
        # v5 can close stdin, which ends cat (stdinOnce) and so the session.
        res = asyncio.run(asyncio.wait_for(exec_websocket(
            url, stdin=b"hello-attach\n", protocols=("v5.channel.k8s.io",)), 30))
    else:
        res = asyncio.run(asyncio.wait_for(exec_spdy(url, stdin=b"hello-attach\n"), 30))
    assert res.stdout == b"hello-attach\n"


def test_port_forward_spdy(streams: Kubelet) -> None:
    async def go() -> tuple[bytes, bytes]:
        fwd = await SpdyPortForward.connect(f"{streams.url}/portForward"
                                            f"{streams.pod_path('streams')}")
        try:
            return await fwd.request(8080, HTTP_GET)
        finally:
            await fwd.close()
    data, err = asyncio.run(asyncio.wait_for(go(), 30))
    assert data.startswith(b"HTTP/1.") and data.endswith(b"forwarded\n"), (data, err)


def test_port_forward_websocket(streams: Kubelet) -> None:
    url = f"{streams.url}/portForward{streams.pod_path('streams')}?port=8080"
    data, err = asyncio.run(asyncio.wait_for(websocket_portforward(url, 8080, HTTP_GET), 30))
    assert data.startswith(b"HTTP/1.") and data.endswith(b"forwarded\n"), (data, err)
