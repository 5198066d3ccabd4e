"""The daemon's Prometheus endpoint (metrics.address) reports the CRI calls it served."""

from __future__ import annotations

import socket
import time
import urllib.request

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.daemon import running_daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_metrics_endpoint_counts_rpcs_and_errors() -> None:
    port = free_port()
    with running_daemon(f'[metrics]\naddress = "127.0.0.1:{port}"\n') as d:
        rt = d.runtime()
        rt.Version(pb.VersionRequest())
        bad = pb.UpdateRuntimeConfigRequest(runtime_config=pb.RuntimeConfig(
            network_config=pb.NetworkConfig(pod_cidr="not-a-cidr")))
        with pytest.raises(grpc.RpcError):
            rt.UpdateRuntimeConfig(bad)
        want = ('crishim_cri_operation_errors_total{code="INVALID_ARGUMENT",'
                'method="UpdateRuntimeConfig"} 1.0')
        # grpc sends an aborted call's status before the handler finishes unwinding (where
        # the error is counted), so the client can see the error a moment before the metric.
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                assert resp.status == 200
                body = resp.read().decode()
            if want in body or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert 'crishim_cri_operation_duration_seconds_count{method="Version"} 1.0' in body
    assert want in body
    assert "crishim_pods" in body and "crishim_containers" in body


def test_metrics_endpoint_off_by_default() -> None:
    with running_daemon("") as d:
        assert "metrics endpoint serving" not in d.logs()


def test_metrics_endpoint_reports_image_pulls(busybox_ref: str) -> None:
    port = free_port()
    with running_daemon(f'[metrics]\naddress = "127.0.0.1:{port}"\n') as d:
        images = d.images()
        images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=busybox_ref)))
        with pytest.raises(grpc.RpcError):
            images.PullImage(pb.PullImageRequest(
                image=pb.ImageSpec(image=busybox_ref.replace("busybox", "no-such-image"))))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            body = resp.read().decode()
    assert 'crishim_image_pulls_total{outcome="success"} 1.0' in body
    assert 'crishim_image_pulls_total{outcome="failure"} 1.0' in body
    pulled = [line for line in body.splitlines()
              if line.startswith("crishim_image_pull_bytes_total ")]
    assert pulled and float(pulled[0].split()[1]) > 100_000  # the busybox layer, compressed
