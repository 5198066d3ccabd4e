"""hosts.toml TLS settings against a registry with a self-signed certificate: `ca` trusts
it, `skip_verify` ignores it, and without either the pull fails."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e import imagebuild as ib
from tests.e2e.daemon import running_daemon
from tests.e2e.registry import Registry


@pytest.fixture(scope="module")
def tls_registry() -> Iterator[tuple[Registry, ib.BuiltImage]]:
    with Registry(tls=True) as reg:
        img = ib.build_busybox(extra_layers=[[ib.file("tls", "t")]])
        ib.push_image(reg.push_host, "tls/app", "v1", img)
        yield reg, img


@pytest.mark.parametrize("setting", ["none", "ca", "skip_verify"])
def test_tls_settings(tls_registry: tuple[Registry, ib.BuiltImage], setting: str) -> None:
    reg, img = tls_registry
    with tempfile.TemporaryDirectory() as certs_d:
        os.makedirs(os.path.join(certs_d, reg.host))
        extra = {"none": "", "ca": f'ca = "{reg.ca_file}"\n',
                 "skip_verify": "skip_verify = true\n"}[setting]
        with open(os.path.join(certs_d, reg.host, "hosts.toml"), "w") as fh:
            fh.write(f'server = "https://{reg.host}"\n{extra}')
        with running_daemon(f'[registry]\nconfig_path = "{certs_d}"\n') as d:
            req = pb.PullImageRequest(image=pb.ImageSpec(image=f"{reg.host}/tls/app:v1"))
            if setting == "none":
                with pytest.raises(grpc.RpcError) as exc:
                    d.images().PullImage(req, timeout=60)
                assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
                assert (exc.value.details() or "").endswith(
                    f"TLS handshake with {reg.host} failed: certificate verify failed: "
                    "self-signed certificate"), exc.value.details()
            else:
                assert d.images().PullImage(req, timeout=60).image_ref == img.image_id
