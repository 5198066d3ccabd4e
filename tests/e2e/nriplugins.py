"""The NRI plugins the e2e and kubelet tests run, and how they read what the daemon says
of them."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.lifecycle import Env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The plugins of containerd/nri v0.12.0, in ../shared/bin/nri beside the repository.
NRI_BIN = os.path.join(os.path.dirname(REPO), "shared", "bin", "nri")


def nri_status(env: Env) -> dict[str, Any]:
    """The "nri" part of the daemon's verbose Status."""
    resp = env.rt().Status(pb.StatusRequest(verbose=True), timeout=10)
    info: dict[str, Any] = json.loads(resp.info["nri"])
    return info


def plugin_names(env: Env) -> list[str]:
    """The names of the plugins registered with the daemon."""
    return [p["name"] for p in nri_status(env)["plugins"]]


def wait_for(cond: Any, what: str, seconds: float = 15.0) -> None:
    """Poll `cond` until it holds, failing after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def annotations_for(container: str, data_dir: str) -> dict[str, str]:
    """Pod annotations asking the real plugins for an rlimit, a device and a mount."""
    return {
        f"ulimits.noderesource.dev/container.{container}":
            "- type: RLIMIT_NOFILE\n  soft: 512\n  hard: 1024\n",
        f"devices.noderesource.dev/container.{container}":
            "- path: /dev/nri-null\n  type: c\n  major: 1\n  minor: 3\n",
        f"mounts.noderesource.dev/container.{container}":
            f"- source: {data_dir}\n  destination: /nri-data\n  type: bind\n"
            "  options: [bind, ro]\n",
    }
