"""NRI under a stock kubelet 1.36: a static pod annotated for the containerd/nri sample
plugins (nri-logger, nri-ulimit-adjuster, nri-device-injector) runs with their rlimit,
device node, read-only mount and env var, as on a containerd 2.3 node."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import busybox_ref, registry  # noqa: F401  (fixtures)
from tests.e2e.faults import networked_daemon
from tests.e2e.nriplugins import NRI_BIN, annotations_for, plugin_names
from tests.e2e.nriplugins import wait_for as wait_until
from tests.e2e.registry import Registry
from tests.kubelet.nodeenv import Node, ctr, kubelet_node, pod, require_kubelet
from tests.kubelet.streams import kubelet_exec

VERSION = "1.36"
_TAG = os.getpid() % 40


@pytest.fixture(scope="module")
def nri_node(registry: Registry, busybox_ref: str) -> Iterator[Node]:  # noqa: F811
    require_kubelet(VERSION, "the NRI kubelet test",
                    "" if os.path.isdir(NRI_BIN) else f"NRI plugins not found at {NRI_BIN}")
    with networked_daemon("crishim-klnri", f"crinrik{_TAG}", f"10.{150 + _TAG % 50}.94.0/24",
                          '[nri]\nsocket_path = "{tmpdir}/nri/nri.sock"\n'
                          'plugin_path = "{tmpdir}/no-plugins"\n',
                          image=busybox_ref) as nd:
        sock = os.path.join(nd.tmpdir, "nri", "nri.sock")
        procs = [subprocess.Popen([os.path.join(NRI_BIN, b), "-idx", idx, flag, sock, *args],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for b, idx, flag, args in (
                     ("nri-logger", "10", "-socket-path", ["-add-env", "NRI_LOGGER"]),
                     ("nri-ulimit-adjuster", "20", "-socket", []),
                     ("nri-device-injector", "30", "-socket-path", []))]
        try:
            with kubelet_node(VERSION, nd, registry, busybox_ref, f"nri-{VERSION}") as node:
                wait_until(lambda: len(plugin_names(node)) == 3, "the plugins to register")  # type: ignore[arg-type]
                yield node
        finally:
            for p in procs:
                p.kill()
                p.wait()


def test_annotated_static_pod_gets_the_plugins_adjustments(nri_node: Node) -> None:
    k = nri_node.kubelet
    data = os.path.join(nri_node.tmpdir, "nri-data")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "hello"), "w") as fh:
        fh.write("from the host\n")
    manifest = pod("nri", [ctr(nri_node, "app", "sleep 3600")])
    manifest["metadata"]["annotations"] = annotations_for("app", data)
    k.write_manifest("nri", manifest)
    k.wait_ready("nri", 90)
    out = kubelet_exec(k, "nri", "app",
                       "ulimit -n; ulimit -Hn; stat -c '%t:%T' /dev/nri-null; "
                       "cat /nri-data/hello; grep ' /nri-data ' /proc/mounts | cut -d' ' -f4;"
                       " echo $NRI_LOGGER")
    lines = out.stdout.decode().split("\n")
    assert lines[:4] == ["512", "1024", "1:3", "from the host"], out
    assert lines[4].startswith("ro"), out
    assert lines[5].startswith("logger-pid-"), out
    k.remove_manifest("nri")
