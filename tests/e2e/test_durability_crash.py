"""Crash anywhere without leaking: kill the daemon at a named step, restart, check.

For a step (crishim/proc/crashpoint.py STEPS) the daemon is restarted with
CRISHIM_TEST_CRASH_AT=<step>, the RPC that reaches the step is made (it fails: the daemon
exits 137 there), the daemon is started again without the variable, and then:
  - the API shows the finished object or nothing (a half-made pod/container/image is never
    listed), and an object that is listed is usable (stop/remove/create work);
  - every listed pod/container agrees with runc, and no netns pin, veth, host-local IP,
    mount, runc container or conmon process exists that no listed object owns;
  - after removing everything through the API, nothing at all is left.
CI runs every step once; the slow suite (CRISHIM_SLOW=1) runs >= 50 randomized
iterations over all steps on one daemon.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.proc.crashpoint import ENV, EXIT_STATUS, STEPS
from tests.e2e.faults import DurabilityEnv, wait_for
from tests.e2e.imagebuild import file, push_busybox
from tests.e2e.registry import Registry

_TAG = 100 + os.getpid() % 50
SLEEP = ["sleep", "3600"]


class Scenario:
    """Prepare what the step's RPC needs, make the RPC, then judge the state after restart."""

    def __init__(self, e: DurabilityEnv, registry: Registry, n: int) -> None:
        self.e = e
        self.registry = registry
        self.n = n
        self.pod_id = ""
        self.pod_cfg = pb.PodSandboxConfig()
        self.cid = ""
        self.image = ""

    # --- the RPC per step family ---
    def prepare(self, step: str) -> Callable[[], object]:
        e = self.e
        rt = e.rt
        if step.startswith("sandbox-stop-") or step.startswith("sandbox-remove-"):
            self.pod_id, self.pod_cfg = e.run_pod(f"crash{self.n}")
            self.cid = e.container(self.pod_id, self.pod_cfg, "c", SLEEP)
            if step.startswith("sandbox-stop-"):
                return lambda: rt().StopPodSandbox(
                    pb.StopPodSandboxRequest(pod_sandbox_id=self.pod_id), timeout=60)
            rt().StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=self.pod_id),
                                timeout=60)
            return lambda: rt().RemovePodSandbox(
                pb.RemovePodSandboxRequest(pod_sandbox_id=self.pod_id), timeout=60)
        if step.startswith("sandbox-"):
            self.pod_cfg = e.pod_config(f"crash{self.n}")
            return lambda: rt().RunPodSandbox(pb.RunPodSandboxRequest(config=self.pod_cfg),
                                              timeout=60)
        if step.startswith("container-"):
            self.pod_id, self.pod_cfg = e.run_pod(f"crash{self.n}")
            if step in START_STEPS:
                self.cid = e.create(self.pod_id, self.pod_cfg, "c", SLEEP)
                return lambda: e.start(self.cid)
            if step.startswith("container-remove-"):
                self.cid = e.create(self.pod_id, self.pod_cfg, "c", SLEEP)
                e.start(self.cid)
                rt().StopContainer(pb.StopContainerRequest(container_id=self.cid, timeout=0),
                                   timeout=60)
                return lambda: rt().RemoveContainer(
                    pb.RemoveContainerRequest(container_id=self.cid), timeout=60)
            return lambda: e.create(self.pod_id, self.pod_cfg, "c", SLEEP)
        if step.startswith("image-"):
            # A fresh top layer, so the pull really downloads and unpacks something.
            repo = f"test/crash{self.n}"
            push_busybox(self.registry.host, repo, "v1",
                         extra_layers=[[file("crash-marker", f"{step} {self.n}\n")]])
            self.image = f"{self.registry.host}/{repo}:v1"
            return lambda: e.d.images().PullImage(
                pb.PullImageRequest(image=pb.ImageSpec(image=self.image)), timeout=120)
        raise AssertionError(f"no scenario for crash step {step}")

    # --- after the restart ---
    def judge(self, step: str) -> None:
        e = self.e
        pods, _ctrs = e.assert_consistent()
        if step.startswith("sandbox-") and not step.startswith(("sandbox-stop-",
                                                                "sandbox-remove-")):
            mine = [p for p in e.pods_listed().values()
                    if p.metadata.name == self.pod_cfg.metadata.name]
            # RunPodSandbox never returned: the half-made pod must have been rolled back
            # (only READY would count as "finished", and the caller never got its id).
            assert not mine, f"{step}: interrupted RunPodSandbox left a pod: {mine}"
            # The name is free again.
            pod_id, _ = e.run_pod_with(self.pod_cfg)
            assert e.pods_listed()[pod_id].state == pb.SANDBOX_READY
        elif step.startswith("sandbox-stop-"):
            assert self.pod_id in pods
            e.rt().StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=self.pod_id),
                                  timeout=60)
            assert e.pods_listed()[self.pod_id].state == pb.SANDBOX_NOTREADY
            assert e.container_status(self.cid).state == pb.CONTAINER_EXITED
            assert self.pod_id not in e.scan().netns, "stopped pod still pins its netns"
        elif step.startswith("sandbox-remove-"):
            e.rt().RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=self.pod_id),
                                    timeout=60)
            assert self.pod_id not in e.pods_listed()
            assert self.cid not in e.containers_listed()
        elif step.startswith("container-"):
            assert self.pod_id in pods
            ours = [c for c in e.containers_listed().values()
                    if c.pod_sandbox_id == self.pod_id]
            if step.startswith("container-remove-"):
                # RemoveContainer never returned: the exited container is still listed
                # (or already gone); removing it again works and leaves nothing.
                assert [c.id for c in ours] in ([self.cid], [])
                e.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=self.cid),
                                       timeout=60)
                assert self.cid not in e.containers_listed()
            elif step in START_STEPS:
                assert [c.id for c in ours] == [self.cid]
                # Created and not started, or started: either way StartContainer's outcome
                # is visible and the container can be driven to the end.
                st = e.container_status(self.cid)
                assert st.state in (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING), st
                if st.state == pb.CONTAINER_CREATED:
                    e.start(self.cid)
                assert e.container_status(self.cid).state == pb.CONTAINER_RUNNING
            else:
                assert not ours, f"{step}: interrupted CreateContainer left {ours}"
                cid = e.container(self.pod_id, self.pod_cfg, "c", SLEEP)  # name is free
                assert e.container_status(cid).state == pb.CONTAINER_RUNNING
        elif step.startswith("image-"):
            listed = e.d.images().ListImages(pb.ListImagesRequest(), timeout=10).images
            tagged = [i for i in listed if self.image in i.repo_tags]
            assert not tagged, f"{step}: interrupted pull is listed: {tagged}"
            tmp = os.path.join(e.d.root, "images", "tmp")
            assert not os.listdir(tmp), f"{step}: tmp left: {os.listdir(tmp)}"
            # Pulling again works and the image runs.
            e.d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=self.image)),
                                   timeout=120)
            pod_id, pod_cfg = e.run_pod(f"img{self.n}")
            cid = e.create(pod_id, pod_cfg, "c", ["cat", "/crash-marker"], image=self.image)
            e.start(cid)
            st = wait_for(lambda: (s := e.container_status(cid)).state ==
                          pb.CONTAINER_EXITED and s, 30, "marker container to exit")
            assert st.exit_code == 0
            e.d.images().RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(
                image=self.image)), timeout=30)
        e.assert_consistent()
        e.remove_all()
        e.assert_nothing_left()


START_STEPS = ("container-before-start", "container-after-launch", "container-after-start")


def crash_at(e: DurabilityEnv, step: str, call: Callable[[], object]) -> None:
    """Restart the daemon armed for `step`, make the call, see it die there, restart."""
    e.d.stop()
    e.restart({ENV: step})
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
    assert e.d.proc is not None
    e.d.proc.wait(30)
    assert e.d.proc.returncode == EXIT_STATUS, \
        f"daemon did not crash at {step} (exit {e.d.proc.returncode})\n{e.d.logs()}"
    e.restart()


def run_step(e: DurabilityEnv, registry: Registry, step: str, n: int) -> None:
    sc = Scenario(e, registry, n)
    call = sc.prepare(step)
    crash_at(e, step, call)
    sc.judge(step)


# Every step, once each, in CI (about 5 s a step); the slow suite adds random orders.
CI_STEPS = list(STEPS)


@pytest.mark.parametrize("step", CI_STEPS)
def test_crash_at_step_leaves_nothing(denv: DurabilityEnv, registry: Registry,
                                      step: str) -> None:
    run_step(denv, registry, step, CI_STEPS.index(step))


def test_every_step_is_reachable_in_the_daemon() -> None:
    """Each documented step name is called somewhere in crishim (a renamed or dropped
    crash point would silently stop being tested)."""
    src = ""
    for dirpath, _dirs, files in os.walk(os.path.join(os.path.dirname(__file__), "..", "..",
                                                      "crishim")):
        for name in files:
            if name.endswith(".py") and name != "crashpoint.py":
                with open(os.path.join(dirpath, name)) as fh:
                    src += fh.read()
    missing = [s for s in STEPS if f'crash_point("{s}")' not in src]
    assert not missing, f"crash steps documented but never called: {missing}"


@pytest.mark.slow
def test_crash_randomized_all_steps(denv: DurabilityEnv, registry: Registry) -> None:
    """CRISHIM_CRASH_SEED picks the order; CRISHIM_CRASH_STEPS=a,b runs just those steps
    once each (to reproduce a failure)."""
    rng = random.Random(int(os.environ.get("CRISHIM_CRASH_SEED", "8")))
    steps = list(STEPS) * 3  # every step at least 3 times, in random order
    while len(steps) < 50:
        steps.append(rng.choice(list(STEPS)))
    rng.shuffle(steps)
    if only := os.environ.get("CRISHIM_CRASH_STEPS"):
        steps = only.split(",")
    for n, step in enumerate(steps):
        run_step(denv, registry, step, 1000 + n)
