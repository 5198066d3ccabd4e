"""Exec, attach and port-forward through the kubelet's own endpoints, which proxy to
crishim's streaming server as they do for kubectl in a cluster."""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

from crishim.streaming.client import ExecResult, exec_spdy, exec_websocket
from tests.kubelet.node import Kubelet


def exec_url(k: Kubelet, pod: str, container: str, cmd: list[str], stdin: bool = False,
             kind: str = "exec") -> str:
    query = [("command", c) for c in cmd] if kind == "exec" else []
    query += [("output", "1"), ("error", "1")] + ([("input", "1")] if stdin else [])
    return f"{k.url}/{kind}{k.pod_path(pod, container)}?{urlencode(query)}"


def kubelet_exec(k: Kubelet, pod: str, container: str, script: str,
                 websocket: bool = False, stdin: bytes | None = None) -> ExecResult:
    url = exec_url(k, pod, container, ["sh", "-c", script], stdin=stdin is not None)
    if websocket:
        return asyncio.run(asyncio.wait_for(
            exec_websocket(url, stdin=stdin, protocols=("v4.channel.k8s.io",)), 30))
    return asyncio.run(asyncio.wait_for(exec_spdy(url, stdin=stdin), 30))
