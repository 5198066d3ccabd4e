"""Storm: 32 concurrent clients racing run/create/start/stop/remove on shared names.

Pod and container names come from small shared pools, so clients clash on names and race
each other's stops and removes. Every call must return within a bound (no deadlock) and
fail, if at all, only with a documented code:
  NOT_FOUND            the object was removed by another client meanwhile
  ALREADY_EXISTS       the pod/container name is reserved by another client's object
  FAILED_PRECONDITION  create on a pod that is not ready / start of a container that is
                       no longer in the created state
Afterwards every listed pod/container agrees with runc, nothing unowned exists, and after
removing everything nothing at all is left. ~20 s in CI, 2 minutes in the slow suite.
"""

from __future__ import annotations

import collections
import functools
import os
import random
import shutil
import threading
import time
from typing import Any

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.faults import DurabilityEnv, durability_env

_TAG = 150 + os.getpid() % 50
CLIENTS = 32
POD_NAMES = 8
CONTAINER_NAMES = 3
# Generous: 32 clients share 2 cores, and a stop waits for its containers' exits.
CALL_BOUND = 120.0
ALLOWED = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS,
           grpc.StatusCode.FAILED_PRECONDITION}


class Storm:
    def __init__(self, e: DurabilityEnv, seconds: float, clients: int = CLIENTS) -> None:
        self.e = e
        self.until = time.monotonic() + seconds
        self.clients = clients
        self.daemon_down = False  # set while the test has killed the daemon
        self.codes: collections.Counter[str] = collections.Counter()
        self.unexpected: list[str] = []
        self.lock = threading.Lock()
        self.pod_cfgs = {i: e.pod_config(f"storm{i}") for i in range(POD_NAMES)}

    def call(self, what: str, fn: Any, req: Any) -> Any:
        t0 = time.monotonic()
        try:
            resp = fn(req, timeout=CALL_BOUND)
            code = "OK"
        except grpc.RpcError as exc:
            resp = None
            code = exc.code().name
            if self.daemon_down and exc.code() == grpc.StatusCode.UNAVAILABLE:
                time.sleep(0.05)
            elif exc.code() not in ALLOWED:
                with self.lock:
                    self.unexpected.append(f"{what}: {exc.code().name}: {exc.details()} "
                                           f"after {time.monotonic() - t0:.1f}s")
        with self.lock:
            self.codes[f"{what} {code}"] += 1
        return resp

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        rt = self.e.d.runtime()
        while time.monotonic() < self.until:
            action = rng.choice(["run", "run", "create", "create", "create", "stop_ctr",
                                 "rm_ctr", "stop_pod", "rm_pod"])
            pods = self.call("ListPodSandbox", rt.ListPodSandbox, pb.ListPodSandboxRequest())
            pod_ids = [p.id for p in pods.items] if pods else []
            if action == "run" or not pod_ids:
                i = rng.randrange(POD_NAMES)
                self.call("RunPodSandbox", rt.RunPodSandbox,
                          pb.RunPodSandboxRequest(config=self.pod_cfgs[i]))
                continue
            pod = rng.choice(pods.items)
            if action == "create":
                cfg = self.e.container_config(f"c{rng.randrange(CONTAINER_NAMES)}",
                                              ["sleep", "3600"])
                resp = self.call("CreateContainer", rt.CreateContainer,
                                 pb.CreateContainerRequest(
                                     pod_sandbox_id=pod.id, config=cfg,
                                     sandbox_config=self.pod_cfgs[int(pod.metadata.name[5:])]))
                if resp is not None:
                    self.call("StartContainer", rt.StartContainer,
                              pb.StartContainerRequest(container_id=resp.container_id))
            elif action in ("stop_ctr", "rm_ctr"):
                ctrs = self.call("ListContainers", rt.ListContainers,
                                 pb.ListContainersRequest())
                if ctrs is None or not ctrs.containers:
                    continue
                cid = rng.choice(ctrs.containers).id
                if action == "stop_ctr":
                    self.call("StopContainer", rt.StopContainer,
                              pb.StopContainerRequest(container_id=cid, timeout=1))
                else:
                    self.call("RemoveContainer", rt.RemoveContainer,
                              pb.RemoveContainerRequest(container_id=cid))
            elif action == "stop_pod":
                self.call("StopPodSandbox", rt.StopPodSandbox,
                          pb.StopPodSandboxRequest(pod_sandbox_id=pod.id))
            else:
                self.call("StopPodSandbox", rt.StopPodSandbox,
                          pb.StopPodSandboxRequest(pod_sandbox_id=pod.id))
                self.call("RemovePodSandbox", rt.RemovePodSandbox,
                          pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id))

    def run(self) -> None:
        self.start()
        self.join()

    def start(self) -> None:
        self.threads = [threading.Thread(target=self.client, args=(n,), daemon=True)
                        for n in range(self.clients)]
        for t in self.threads:
            t.start()

    def join(self) -> None:
        for t in self.threads:
            # A client's last call started before `until` and is bounded by CALL_BOUND
            # (x a few calls per loop): a thread still alive after that is a deadlock.
            t.join(max(1.0, self.until - time.monotonic()) + 4 * CALL_BOUND)
            assert not t.is_alive(), f"client stuck; codes so far {dict(self.codes)}\n" \
                f"{self.e.d.logs()[-4000:]}"


def storm(e: DurabilityEnv, seconds: float) -> None:
    s = Storm(e, seconds)
    s.run()
    summary = dict(sorted(s.codes.items()))
    if s.unexpected:  # keep the daemon's log for the post-mortem (the workdir goes)
        shutil.copy(e.d.log_path, saved := f"/tmp/crishim-storm-{os.getpid()}.log")
        summary["daemon log"] = saved  # type: ignore[assignment]
    assert not s.unexpected, f"undocumented errors: {s.unexpected[:10]}\nall: {summary}"
    # The storm did real work, not only refusals.
    assert s.codes["RunPodSandbox OK"] and s.codes["StartContainer OK"], summary
    assert s.codes["RemovePodSandbox OK"], summary
    e.assert_consistent()
    e.remove_all()
    e.assert_nothing_left()


def test_storm_ci(denv: DurabilityEnv) -> None:
    storm(denv, 20)


@pytest.mark.slow
def test_storm_two_minutes(denv: DurabilityEnv) -> None:
    storm(denv, 120)


def kill9_storms(e: DurabilityEnv, cycles: int, seed: int) -> None:
    """SIGKILL the daemon at a random moment of a storm (not at a crash point: anywhere),
    restart it, and check the state it reconciled to."""
    rng = random.Random(seed)
    for _ in range(cycles):
        s = Storm(e, 60, clients=16)
        s.start()
        time.sleep(rng.uniform(3, 8))
        s.daemon_down = True
        e.d.kill9()
        s.until = time.monotonic()  # clients finish their current call and stop
        s.join()
        assert not s.unexpected, f"undocumented errors: {s.unexpected[:10]}"
        t0 = time.monotonic()
        e.restart()
        t1 = time.monotonic()
        e.assert_consistent()
        print(f"kill9 cycle: restart {t1 - t0:.1f}s, check {time.monotonic() - t1:.1f}s")
    t2 = time.monotonic()
    e.remove_all()
    print(f"kill9: remove_all {time.monotonic() - t2:.1f}s")
    e.assert_nothing_left()


def test_kill9_during_storm(denv: DurabilityEnv) -> None:
    kill9_storms(denv, 1, seed=1)


@pytest.mark.slow
def test_kill9_during_storm_repeated(denv: DurabilityEnv) -> None:
    kill9_storms(denv, 6, seed=int(os.environ.get("CRISHIM_STORM_SEED", "2")))


def test_concurrent_first_pods_on_a_fresh_daemon(busybox_ref: str) -> None:
    """The first pods of a fresh root race to build shared state (the embedded pause
    rootfs): 12 concurrent RunPodSandbox calls all succeed."""
    with durability_env(busybox_ref, _TAG + 1) as e:
        e.d.stop()
        shutil.rmtree(os.path.join(e.d.root, "pause"), ignore_errors=True)
        e.restart()
        cfgs = [e.pod_config(f"first{i}") for i in range(12)]
        errors: list[str] = []

        def run(cfg: pb.PodSandboxConfig) -> None:
            try:
                e.run_pod_with(cfg)
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()}")

        threads = [threading.Thread(target=run, args=(c,)) for c in cfgs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(CALL_BOUND)
            assert not t.is_alive(), f"RunPodSandbox stuck for {CALL_BOUND}s"
        assert not errors, errors
        assert len(e.pods_listed()) == len(cfgs)
        e.assert_consistent()
        e.remove_all()
        e.assert_nothing_left()


def _late_stop(e: DurabilityEnv, req: pb.StopPodSandboxRequest, delay: float) -> None:
    time.sleep(delay)
    e.rt().StopPodSandbox(req, timeout=CALL_BOUND)


def test_removed_pods_stay_removed_after_restart(denv: DurabilityEnv) -> None:
    """StopPodSandbox calls racing a RemovePodSandbox of the same pod must not bring its
    record back: after a kill -9 and restart the removed pods are not listed."""
    e = denv
    removed = []
    for i in range(4):
        pod_id, cfg = e.run_pod(f"race{i}")
        e.container(pod_id, cfg, "c", ["sleep", "3600"])
        rm = pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id)
        stop = pb.StopPodSandboxRequest(pod_sandbox_id=pod_id)
        calls: list[Any] = [lambda r=rm: e.rt().RemovePodSandbox(r, timeout=CALL_BOUND)]
        # Staggered: a stop must find the pod before the remove drops it and get the pod
        # lock after, which depends on where the remove is when the stop arrives.
        calls += [functools.partial(_late_stop, e, stop, 0.04 * n) for n in range(16)]
        threads = [threading.Thread(target=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(CALL_BOUND)
            assert not t.is_alive(), f"a stop or remove of {pod_id} stuck for {CALL_BOUND}s"
        assert pod_id not in e.pods_listed()
        removed.append(pod_id)
    e.d.kill9()
    e.restart()
    back = [p for p in e.pods_listed() if p in removed]
    assert not back, f"removed pods came back after a restart: {back}"
    e.assert_consistent()
    e.assert_nothing_left()
