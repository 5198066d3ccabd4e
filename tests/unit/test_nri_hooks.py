"""The managers' one NRI object (crishim/nri/hooks.py): the null object when NRI is off,
and LiveNRI, which calls the adaptation only while a plugin or the validator is there."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.node.daemon import _nri_hooks
from crishim.nri.adaptation import NRI
from crishim.nri.hooks import NO_NRI, LiveNRI, NRIHooks
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

SB = Sandbox(id="p1", name="p1_ns_uid_0", runtime_handler="runc", created_at=0,
             config=pb.PodSandboxConfig())
CTR = Container(id="c1", pod_id="p1", name="c1_x", runtime_handler="runc",
                config=pb.ContainerConfig(), created_at=0, image_name="img",
                image_id="sha256:1", image_ref="img", bundle="/nonexistent",
                rootfs="/nonexistent", persist_dir="/nonexistent")


class Adaptation:
    """Records the calls an NRI adaptation gets."""

    def __init__(self) -> None:
        self.active = False
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any) -> Any:
            self.calls.append(name)
            if name == "update_container":
                return "merged", {"memory": {}}
            return None

        def watch(*args: Any) -> None:
            self.calls.append(name)
        return watch if name == "watch_exit" else call


async def _every_step(hooks: NRIHooks) -> tuple[Any, Any]:
    res = pb.LinuxContainerResources()
    await hooks.run_pod_sandbox(SB)
    await hooks.update_pod_sandbox(SB, res, res)
    await hooks.post_update_pod_sandbox(SB)
    await hooks.post_create_container(SB, CTR)
    await hooks.start_container(SB, CTR)
    await hooks.post_start_container(SB, CTR, asyncio.Event())
    updated = await hooks.update_container(SB, CTR, res, {})
    await hooks.post_update_container(SB, CTR)
    await hooks.stop_container(SB, CTR)
    await hooks.remove_container(SB, CTR)
    await hooks.stop_pod_sandbox(SB)
    await hooks.remove_pod_sandbox(SB)
    return hooks.adjuster(SB), updated


async def test_the_null_object_does_nothing_and_keeps_the_update_as_asked() -> None:
    adjuster, updated = await _every_step(NO_NRI)
    assert adjuster is None
    assert updated == (pb.LinuxContainerResources(), {})


async def test_live_nri_calls_the_plugins_only_while_it_is_active() -> None:
    fake = Adaptation()
    hooks = LiveNRI(cast(NRI, fake))
    assert await _every_step(hooks) == (None, (pb.LinuxContainerResources(), {}))
    assert fake.calls == []
    fake.active = True  # a plugin connected
    adjuster, updated = await _every_step(hooks)
    assert adjuster is not None
    assert updated == ("merged", {"memory": {}})
    assert fake.calls == [
        "run_pod_sandbox", "update_pod_sandbox", "post_update_pod_sandbox",
        "post_create_container", "start_container", "post_start_container", "watch_exit",
        "update_container", "post_update_container", "stop_container", "remove_container",
        "stop_pod_sandbox", "remove_pod_sandbox"]


def test_node_gives_the_managers_the_null_object_only_when_nri_can_never_be_on() -> None:
    nri = cast(NRI, Adaptation())
    cfg = Config()
    cfg.nri.enable = False
    cfg.nri.default_validator.enable = False
    assert _nri_hooks(cfg, nri) is NO_NRI
    cfg.nri.default_validator.enable = True
    assert isinstance(_nri_hooks(cfg, nri), LiveNRI)
    cfg.nri.default_validator.enable = False
    cfg.nri.enable = True
    assert isinstance(_nri_hooks(cfg, nri), LiveNRI)
