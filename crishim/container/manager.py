"""ContainerManager: the lifecycle of CRI containers (runc under conmon).

Layout: bundle + overlay rootfs + upper/work under {root}/containers/<id>/, conmon's
persist dir under {state}/conmon/<id>, exit files in {state}/exits. Every multi-step
change records an intent first so `reconcile()` can roll back what a crash interrupted.
State lives in memory (ListContainers is served from memory) and is written through to
the database on every change.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import time
from typing import Any

from google.protobuf import json_format

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config
from crishim.container import imagevolume
from crishim.container import rootfs as rootfs_mod
from crishim.container.execsync import ExecResult, exec_process, exec_sync
from crishim.container.record import (
    CREATED,
    EXITED,
    MAX_MESSAGE,
    RUNNING,
    Container,
    reserved_name,
)
from crishim.container.spec import (
    CONTAINER_TYPE,
    HostInfo,
    PodInfo,
    SpecInputs,
    build_spec,
)
from crishim.container.stopsignal import stop_signal
from crishim.container.user import UserRequest, resolve_user
from crishim.crashpoint import crash_point
from crishim.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
)
from crishim.events import EventBus
from crishim.image.manager import ImageManager
from crishim.image.store import Image
from crishim.log import get_logger
from crishim.oci import conmon
from crishim.oci import spec as oci_spec
from crishim.oci.exits import ExitWatcher
from crishim.oci.runc import (
    OCIRuntime,
    OCIRuntimeError,
    RuntimeRegistry,
    read_pid_file,
    unowned_containers,
)
from crishim.sandbox.model import Sandbox
from crishim.sandbox.podfiles import pod_hostname
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.db import Database
from crishim.store.records import by_id_or_prefix

log = get_logger(__name__)

KIND = "container"
# How long StopContainer waits for the exit after SIGKILL before giving up.
KILL_WAIT = 30.0
# How long ReopenContainerLog waits for conmon to recreate the log file: the kubelet
# (and critest) look at the new file as soon as the call returns.
REOPEN_WAIT = 5.0


def _now() -> int:
    return time.time_ns()


class ContainerManager:
    def __init__(self, cfg: Config, db: Database, events: EventBus, pods: SandboxRegistry,
                 images: ImageManager, runtimes: RuntimeRegistry, exits: ExitWatcher,
                 host: HostInfo) -> None:
        """`exits`: the daemon's exit-file watcher, started before us."""
        self.cfg = cfg
        self.db = db
        self.events = events
        self.pods = pods
        self.images = images
        self.runtimes = runtimes
        self.containers_dir = os.path.join(cfg.root, "containers")
        self.conmon_dir = os.path.join(cfg.state, "conmon")
        self.exec_dir = os.path.join(cfg.state, "exec")
        self.watcher = exits
        self.exit_dir = exits.exit_dir
        self._containers: dict[str, Container] = {}
        self._names: dict[str, str] = {}  # reserved name → id
        self._exited: dict[str, asyncio.Event] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # One stop at a time per container: runc freezes the cgroup while it signals
        # `kill --all`, and a second runc kill then fails on the "paused" container.
        self._stop_locks: dict[str, asyncio.Lock] = {}
        self._host = host
        # Exit clean-ups in flight (runc delete + unmount), and background file deletes.
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        # Bundles of removed containers wait here for their background delete; whatever
        # a crash leaves is swept at start with the other orphans.
        self.trash_dir = os.path.join(self.containers_dir, ".trash")

    # -- lifecycle of the manager -----------------------------------------------------------
    async def start(self) -> None:
        for d in (self.containers_dir, self.conmon_dir, self.exec_dir):
            os.makedirs(d, mode=0o711, exist_ok=True)
        await self.reconcile()

    async def stop(self) -> None:
        # Containers keep running under conmon; only stop watching.
        for cid in list(self._containers):
            self.watcher.unwatch(cid)

    def _lock(self, cid: str) -> asyncio.Lock:
        return self._locks.setdefault(cid, asyncio.Lock())

    async def _killed_before_start(self, rec: Container, exc: Exception) -> bool:
        """After a failed `runc start`: did a concurrent stop kill the created process?
        (A process in the created state waits on runc's exec fifo; only a signal ends it.)"""
        if "has stopped" in str(exc):
            return True
        try:
            st = await self.runtime_for(rec).state(rec.id)
        except Exception:
            return False
        # "paused": a concurrent `runc kill --all` has the cgroup frozen right now.
        return st is None or st.get("status") in ("stopped", "paused")

    # -- lookups ----------------------------------------------------------------------------
    def find(self, cid: str) -> Container | None:
        """By full id or unique id prefix (as crictl passes short ids)."""
        return by_id_or_prefix(self._containers, cid, "container")

    def get(self, cid: str) -> Container:
        rec = self.find(cid)
        if rec is None:
            raise NotFound(f"container {cid!r} does not exist")
        return rec

    def list_containers(self, flt: pb.ContainerFilter | None = None) -> list[Container]:
        out = []
        for c in self._containers.values():
            if flt is not None:
                if flt.id and not c.id.startswith(flt.id):
                    continue
                if flt.HasField("state") and c.state != flt.state.state:
                    continue
                if flt.pod_sandbox_id and not c.pod_id.startswith(flt.pod_sandbox_id):
                    continue
                labels = c.config.labels
                if any(labels.get(k) != v for k, v in flt.label_selector.items()):
                    continue
            out.append(c)
        return sorted(out, key=lambda c: c.created_at)

    def pod_statuses(self, pod_id: str) -> list[pb.ContainerStatus]:
        return [c.status_proto() for c in self.for_pod(pod_id)]

    def for_pod(self, pod_id: str) -> list[Container]:
        return [c for c in self._containers.values() if c.pod_id == pod_id]

    def runtime_for(self, rec: Container) -> OCIRuntime:
        return self.runtimes.get(rec.runtime_handler)

    async def _save(self, rec: Container) -> None:
        await self.db.put(KIND, rec.id, rec.to_dict())

    def _event(self, rec: Container, kind: pb.ContainerEventType) -> None:
        # Like containerd: the pod's status and all of its containers' statuses, which
        # is what the kubelet's evented PLEG caches.
        # A DELETED container is gone from the manager already: the pod's others remain.
        sb = self.pods.exact(rec.pod_id)
        self.events.publish(pb.ContainerEventResponse(
            container_id=rec.id, container_event_type=kind, created_at=_now(),
            pod_sandbox_status=sb.status_proto() if sb is not None else None,
            containers_statuses=self.pod_statuses(rec.pod_id)))

    # -- create ------------------------------------------------------------------------------
    async def create(self, pod_id: str, config: pb.ContainerConfig,
                     sandbox_config: pb.PodSandboxConfig | None = None) -> Container:
        if not config.metadata.name:
            raise InvalidArgument("container config metadata.name is required")
        if not config.image.image:
            raise InvalidArgument("container config image.image is required")
        sb = self.pods.find(pod_id)
        if sb is None:
            raise NotFound(f"pod sandbox {pod_id!r} does not exist")
        if sb.state != pb.SANDBOX_READY:
            raise FailedPrecondition(f"pod sandbox {sb.id} is not ready; cannot add a "
                                     "container to it")
        name = reserved_name(config.metadata, sb.config.metadata)
        if name in self._names:
            raise AlreadyExists(f"container name {name!r} is already reserved for "
                                f"{self._names[name]}")
        cid = secrets.token_hex(32)
        self._names[name] = cid  # reserved before the first await: no concurrent twin
        try:
            image = self.images.get(config.image.image)
            if image is None:
                raise NotFound(f"image {config.image.image!r} is not present; pull it first")
            # Held across the create: a StopPodSandbox/RemovePodSandbox in between would
            # otherwise stop the pod under a half-made container (runc then fails to join
            # the dead pause's namespaces, or the container outlives its pod).
            async with self.pods.pod_lock(sb.id):
                if self.pods.exact(sb.id) is not sb or sb.state != pb.SANDBOX_READY:
                    raise FailedPrecondition(f"pod sandbox {sb.id} was stopped or removed; "
                                             "cannot add a container to it")
                return await self._create(cid, name, sb, config, image)
        except BaseException:
            self._names.pop(name, None)
            raise

    async def _create(self, cid: str, name: str, sb: Sandbox, config: pb.ContainerConfig,
                      image: Image) -> Container:
        runtime = self.runtimes.get(sb.runtime_handler)
        bundle = os.path.join(self.containers_dir, cid)
        persist = os.path.join(self.conmon_dir, cid)
        await self.db.add_intent(cid, KIND, {"op": "create", "bundle": bundle,
                                             "persist_dir": persist,
                                             "runtime": runtime.name})
        crash_point("container-after-intent")
        try:
            rec = await self._build(cid, name, sb, config, image, runtime, bundle, persist)
        except BaseException:
            # Nothing was launched yet (that happens at StartContainer): no runc container.
            await self._rollback(cid, bundle, persist, None)
            await self.db.remove_intent(cid)
            raise
        crash_point("container-before-record")
        self._containers[cid] = rec
        self._exited[cid] = asyncio.Event()
        await self.db.put(KIND, cid, rec.to_dict(), clear_intent=cid)
        for image_id in {image.id, *_volume_image_ids(rec.config)}:
            self.images.mark_used(image_id, cid)
        self.watcher.watch(cid, self._on_exit)
        log.info("container created", id=cid, name=name, pod=sb.id, image=image.id)
        self._event(rec, pb.CONTAINER_CREATED_EVENT)
        return rec

    async def _build(self, cid: str, name: str, sb: Sandbox, config: pb.ContainerConfig,
                     image: Image, runtime: OCIRuntime, bundle: str,
                     persist: str) -> Container:
        os.makedirs(bundle, mode=0o711, exist_ok=True)
        imagevolume.validate(config)
        rootfs = await rootfs_mod.mount_rootfs(list(image.layer_dirs), bundle)
        crash_point("container-after-rootfs")
        img_cfg: dict[str, Any] = dict(image.config.get("config") or {})
        sc = config.linux.security_context
        req = UserRequest(
            run_as_user=sc.run_as_user.value if sc.HasField("run_as_user") else None,
            run_as_username=sc.run_as_username,
            run_as_group=sc.run_as_group.value if sc.HasField("run_as_group") else None,
            supplemental_groups=list(sc.supplemental_groups),
            strict_groups=sc.supplemental_groups_policy == pb.Strict)
        user = await asyncio.to_thread(resolve_user, rootfs, str(img_cfg.get("User") or ""),
                                       req)
        pod = self._pod_info(sb)
        host = self._host
        opts = sc.namespace_options if sc.HasField("namespace_options") \
            else sb.config.linux.security_context.namespace_options
        if opts.pid == pb.TARGET:
            target = self.find(opts.target_id)
            if target is None or target.state != RUNNING:
                raise NotFound(f"pid namespace target container {opts.target_id!r} is not "
                               "running")
            host = dataclasses.replace(host, target_pid=target.pid)
        term_log = ""
        if config.annotations.get("io.kubernetes.container.terminationMessagePath"):
            term_log = os.path.join(bundle, "termination-log")
            await asyncio.to_thread(_create_world_writable, term_log)
        # In a thread: it stats host paths and devices (privileged walks all of /dev).
        volumes = await imagevolume.mount_all(config, self.images, bundle)
        inputs = SpecInputs(container_id=cid, config=config, pod=pod, image_config=img_cfg,
                            image_name=config.image.image, rootfs=rootfs, user=user,
                            host=host, termination_log=term_log,
                            image_volumes={v.index: v.source for v in volumes})
        spec = await asyncio.to_thread(build_spec, inputs)
        await asyncio.to_thread(oci_spec.write_bundle, bundle, spec)
        log_path = ""
        if config.log_path:
            log_dir = sb.config.log_directory
            log_path = config.log_path if os.path.isabs(config.log_path) or not log_dir \
                else os.path.join(log_dir, config.log_path)
            if not os.path.isabs(log_path):
                raise InvalidArgument(f"log path {log_path!r} must be absolute (set the pod's "
                                      "log_directory)")
            os.makedirs(os.path.dirname(log_path), mode=0o755, exist_ok=True)
        digests = image.repo_digests
        return Container(
            id=cid, pod_id=sb.id, name=name, config=config, runtime_handler=runtime.name,
            created_at=_now(), image_id=image.id,
            image_name=(image.repo_tags or [config.image.image])[0],
            image_ref=digests[0] if digests else image.id, bundle=bundle, rootfs=rootfs,
            persist_dir=persist, log_path=log_path, state=CREATED,
            stop_signal=stop_signal(config, img_cfg),
            uid=user.uid, gid=user.gid, gids=list(user.additional_gids),
            termination_log=term_log, cgroups_path=spec["linux"].get("cgroupsPath", ""))

    def _pod_info(self, sb: Sandbox) -> PodInfo:
        meta = sb.config.metadata
        d = sb.sandbox_dir
        opts = sb.config.linux.security_context.namespace_options
        return PodInfo(
            id=sb.id, name=meta.name, namespace=meta.namespace, uid=meta.uid,
            hostname=pod_hostname(sb.config, opts.network == pb.NODE),
            netns_path=sb.netns_path, pause_pid=sb.pid, cgroup_parent=sb.cgroup_parent,
            hosts_path=_existing(os.path.join(d, "hosts")) if d else "",
            resolv_path=_existing(os.path.join(d, "resolv.conf")) if d else "",
            hostname_path=_existing(os.path.join(d, "hostname")) if d else "",
            shm_path=sb.shm_path, sysctls=dict(sb.config.linux.sysctls),
            namespace_options=opts)

    async def _rollback(self, cid: str, bundle: str, persist: str,
                        runtime: OCIRuntime | None) -> None:
        """Undo a partial create: runc container, conmon, mounts, dirs (idempotent)."""
        if runtime is not None:
            with contextlib.suppress(Exception):
                await runtime.delete(cid, force=True)
        with contextlib.suppress(Exception):
            conmon.kill_conmon(persist)
        with contextlib.suppress(Exception):
            await conmon.remove_monitor_files(cid, bundle, persist, self.exit_dir)
        await self._remove_bundle(bundle)

    async def _remove_bundle(self, bundle: str) -> None:
        for mp in await asyncio.to_thread(rootfs_mod.mounted_under, bundle):
            await asyncio.to_thread(rootfs_mod.unmount, mp)
        await asyncio.to_thread(shutil.rmtree, bundle, True)

    # -- start / stop ------------------------------------------------------------------------
    async def start_container(self, cid: str) -> None:
        rec = self.get(cid)
        # The pod lock: a concurrent StopPodSandbox finishes first (and we then refuse) or
        # waits until the container runs (and then stops it).
        async with self.pods.pod_lock(rec.pod_id), self._lock(rec.id):
            if rec.state != CREATED:
                raise FailedPrecondition(f"container {rec.id} is not in the created state "
                                         f"(it is {pb.ContainerState.Name(rec.state)})")
            sb = self.pods.exact(rec.pod_id)
            if sb is None or sb.state != pb.SANDBOX_READY:
                raise FailedPrecondition(f"pod sandbox {rec.pod_id} of container {rec.id} is "
                                         "not ready; the container cannot be started")
            crash_point("container-before-start")
            if not rec.launched:
                try:
                    await self._launch(rec)
                except OCIRuntimeError as exc:
                    await self._start_failed(rec, exc)
                    raise
            # Taken before `runc start`: the process may exit before start returns, and
            # started_at must never be later than finished_at.
            rec.started_at = _now()
            try:
                await self.runtime_for(rec).start(rec.id)
            except OCIRuntimeError as exc:
                if await self._killed_before_start(rec, exc):
                    raise FailedPrecondition(f"container {rec.id} was stopped before it "
                                             "could start") from None
                await self._start_failed(rec, exc)
                raise
            crash_point("container-after-start")
            # The exit callback may already have run (a very short-lived container).
            if rec.state == CREATED:
                rec.state = RUNNING
            await self._save(rec)
        log.info("container started", id=rec.id)
        self._event(rec, pb.CONTAINER_STARTED_EVENT)

    async def _launch(self, rec: Container) -> None:
        """conmon + `runc create`: the container's process exists, waiting to be started.

        Done by StartContainer rather than CreateContainer (as containerd creates its task
        at start): a created container is a prepared bundle and costs no process."""
        runtime = self.runtime_for(rec)
        if rec.log_path:
            await asyncio.to_thread(os.makedirs, os.path.dirname(rec.log_path), 0o755, True)
        config = rec.config
        try:
            created = await conmon.create(conmon.MonitorRequest(
                container_id=rec.id, bundle=rec.bundle, runtime=runtime,
                log_path=rec.log_path, exit_dir=self.exit_dir, persist_dir=rec.persist_dir,
                stdin=config.stdin, stdin_once=config.stdin_once, tty=config.tty,
                conmon_path=self.cfg.conmon_path, name=rec.name))
        except BaseException:
            with contextlib.suppress(Exception):
                await runtime.delete(rec.id, force=True)
            conmon.kill_conmon(rec.persist_dir)
            raise
        rec.pid, rec.conmon_pid = created.pid, created.conmon_pid
        crash_point("container-after-launch")

    async def _start_failed(self, rec: Container, exc: Exception) -> None:
        """Like containerd: a container that could not start is EXITED with StartError."""
        await self._finish(rec, 128, "StartError", str(exc), _now())

    async def _on_exit(self, cid: str, code: int, finished_ns: int) -> None:
        rec = self._containers.get(cid)
        if rec is None or rec.state == EXITED:
            return
        reason = "OOMKilled" if self._oom_killed(rec) else \
            ("Completed" if code == 0 else "Error")
        await self._finish(rec, code, reason, self._termination_message(rec), finished_ns)
        log.info("container exited", id=cid, code=code, reason=rec.reason)
        self._event(rec, pb.CONTAINER_STOPPED_EVENT)

    async def _finish(self, rec: Container, code: int, reason: str, message: str,
                      finished_ns: int) -> None:
        """The container ended: record how (EXITED before the first await, so a second
        report of the same exit is ignored), release what it held, wake a waiting stop,
        persist."""
        rec.state, rec.exit_code, rec.finished_at = EXITED, code, finished_ns
        rec.reason, rec.message = reason, message
        await self._release(rec)
        self._exited.setdefault(rec.id, asyncio.Event()).set()
        await self._save(rec)

    async def _release(self, rec: Container) -> None:
        """Once the container is dead: delete its runc container and unmount its rootfs
        (and image volumes), as containerd's shim does when a task exits. The bundle's files
        stay until RemoveContainer. Failures leave `released` False; Remove then does the
        full cleanup."""
        task = self._releasing.get(rec.id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._do_release(rec))
            self._releasing[rec.id] = task
            cid = rec.id

            def done(_t: asyncio.Task[None]) -> None:
                self._releasing.pop(cid, None)

            task.add_done_callback(done)
        await asyncio.shield(task)

    async def _do_release(self, rec: Container) -> None:
        if rec.released:
            return
        try:
            runtime = self.runtime_for(rec)  # raises for a handler no longer configured
            if rec.launched:
                try:
                    await runtime.delete(rec.id)
                except OCIRuntimeError as exc:
                    # Still "running" for runc (e.g. other processes in a shared pid
                    # namespace): force it.
                    log.debug("plain delete failed; forcing", id=rec.id, error=str(exc))
                    await runtime.delete(rec.id, force=True)
            image_mounts = any(imagevolume.is_image_mount(m) for m in rec.config.mounts)
            await asyncio.to_thread(rootfs_mod.unmount_all, rec.rootfs, rec.bundle,
                                    image_mounts)
        except Exception as exc:
            log.warning("releasing the exited container failed; RemoveContainer will retry",
                        id=rec.id, error=str(exc))
            return
        rec.released = True

    def _oom_killed(self, rec: Container) -> bool:
        # conmon watches the cgroup's OOM events and leaves a file named "oom".
        if os.path.exists(os.path.join(rec.persist_dir, "oom")):
            return True
        if not rec.cgroups_path or self._host.facts.cgroup_driver == "systemd":
            return False
        rel = rec.cgroups_path.lstrip("/")
        for path, key in ((f"/sys/fs/cgroup/memory/{rel}/memory.oom_control", "oom_kill"),
                          (f"/sys/fs/cgroup/{rel}/memory.events", "oom_kill")):
            with contextlib.suppress(OSError, ValueError), open(path) as fh:
                for line in fh:
                    k, _, v = line.partition(" ")
                    if k == key and int(v) > 0:
                        return True
        return False

    def _termination_message(self, rec: Container) -> str:
        if not rec.termination_log:
            return ""
        with contextlib.suppress(OSError), open(rec.termination_log, "rb") as fh:
            return fh.read(MAX_MESSAGE).decode(errors="replace")
        return ""

    async def stop_container(self, cid: str, grace: float) -> None:
        """Stop signal, wait `grace` s, then SIGKILL. Idempotent (also for unknown ids)."""
        rec = self.find(cid)
        if rec is None or rec.state == EXITED:
            return
        async with self._stop_locks.setdefault(rec.id, asyncio.Lock()):
            if rec.state != EXITED:  # else a concurrent stop finished it meanwhile
                await self._stop(rec, grace)

    async def _stop(self, rec: Container, grace: float) -> None:
        if rec.state == CREATED and not rec.launched:
            # Start holds the container's lock while it launches: wait for it, then either
            # nothing ever ran (EXITED at once) or we stop a running container below.
            async with self._lock(rec.id):
                if rec.state == CREATED and not rec.launched:
                    await self._stop_unstarted(rec)
                    return
        runtime = self.runtime_for(rec)
        ev = self._exited.setdefault(rec.id, asyncio.Event())
        if grace > 0 and rec.state == RUNNING:
            await runtime.kill(rec.id, rec.stop_signal)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), grace)
        if rec.state != EXITED:
            await runtime.kill(rec.id, signal.SIGKILL, all_procs=True)
            if not conmon.conmon_alive(rec.persist_dir):
                await asyncio.sleep(0.2)  # nobody will write an exit file: ask runc
                await self._check_exit(rec)
            try:
                await asyncio.wait_for(ev.wait(), KILL_WAIT)
            except TimeoutError:
                await self._check_exit(rec)
                if rec.state != EXITED:
                    raise Internal(f"container {rec.id} did not exit {KILL_WAIT:g}s after "
                                   "SIGKILL") from None
        log.info("container stopped", id=rec.id)

    async def _stop_unstarted(self, rec: Container) -> None:
        """A container that was created but never started has no process: it just ends."""
        await self._finish(rec, 128 + signal.SIGKILL, "Error", "stopped before it was started",
                           _now())
        log.info("container stopped", id=rec.id, started=False)
        self._event(rec, pb.CONTAINER_STOPPED_EVENT)

    async def _check_exit(self, rec: Container) -> None:
        """Pick up an exit the watcher may not have delivered yet; without an exit file
        (its conmon died) trust runc: a stopped container was killed."""
        res = self.watcher.read_exit(rec.id)
        if res is not None:
            await self._on_exit(rec.id, *res)
            return
        st = await self.runtime_for(rec).state(rec.id)
        if st is None or st.get("status") == "stopped":
            await self._on_exit(rec.id, 128 + signal.SIGKILL, _now())

    # -- remove ------------------------------------------------------------------------------
    async def remove_container(self, cid: str) -> None:
        rec = self.find(cid)
        if rec is None:
            return
        if rec.state in (RUNNING, CREATED):
            await self.stop_container(rec.id, 0)
        async with self._lock(rec.id):
            if rec.id not in self._containers:
                return
            task = self._releasing.get(rec.id)
            if task is not None:
                await asyncio.shield(task)
            self.watcher.unwatch(rec.id)
            if rec.released:
                await self._remove_released(rec)
            else:
                await self._remove_full(rec)
            self._containers.pop(rec.id, None)
            self._exited.pop(rec.id, None)
            self._names.pop(rec.name, None)
        self._locks.pop(rec.id, None)
        self._stop_locks.pop(rec.id, None)
        for image_id in {rec.image_id, *_volume_image_ids(rec.config)}:
            self.images.unmark_used(image_id, rec.id)
        log.info("container removed", id=rec.id)
        self._event(rec, pb.CONTAINER_DELETED_EVENT)

    async def _remove_released(self, rec: Container) -> None:
        """Nothing runs and nothing is mounted: move the bundle aside (one rename), forget
        the record, and delete the files in the background. What a crash leaves of them
        (the trash dir, conmon's files) the next start sweeps as orphans."""
        crash_point("container-remove-before-files")
        trash = await asyncio.to_thread(self._bundle_to_trash, rec)
        await self.db.delete(KIND, rec.id)
        self._spawn(asyncio.to_thread(self._drop_files, rec, trash))

    def _bundle_to_trash(self, rec: Container) -> str:
        trash = os.path.join(self.trash_dir, rec.id)
        try:
            os.makedirs(self.trash_dir, mode=0o700, exist_ok=True)
            os.rename(rec.bundle, trash)
        except FileNotFoundError:
            return ""
        return trash

    def _drop_files(self, rec: Container, trash: str) -> None:
        conmon.remove_monitor_files_sync(rec.id, rec.bundle, rec.persist_dir, self.exit_dir)
        if trash:
            shutil.rmtree(trash, ignore_errors=True)

    async def _remove_full(self, rec: Container) -> None:
        """The container may still exist for runc or have mounts: undo everything, with an
        intent so that a crash half-way is finished at the next start."""
        await self.db.add_intent(rec.id, KIND, {"op": "remove", "bundle": rec.bundle,
                                                "persist_dir": rec.persist_dir,
                                                "runtime": rec.runtime_handler})
        with contextlib.suppress(InvalidArgument):
            await self.runtime_for(rec).delete(rec.id, force=True)
        conmon.kill_conmon(rec.persist_dir)
        await conmon.remove_monitor_files(rec.id, rec.bundle, rec.persist_dir, self.exit_dir)
        await self._remove_bundle(rec.bundle)
        await self.db.delete(KIND, rec.id)
        await self.db.remove_intent(rec.id)

    def _spawn(self, aw: Any) -> None:
        task = asyncio.ensure_future(aw)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def update_resources(self, rec: Container, resources: dict[str, Any]) -> None:
        """New OCI resources: `runc update` for a live container; for one not started
        yet, into its bundle's config.json (what `runc create` will apply)."""
        async with self._lock(rec.id):
            if rec.launched:
                await self.runtime_for(rec).update(rec.id, resources)
                return
            spec = await asyncio.to_thread(oci_spec.read_bundle, rec.bundle)
            current = spec.setdefault("linux", {}).setdefault("resources", {})
            current.update(resources)
            await asyncio.to_thread(oci_spec.write_bundle, rec.bundle, spec)

    # -- pod hooks ---------------------------------------------------------------------------
    async def stop_pod_containers(self, pod_id: str) -> None:
        await asyncio.gather(*(self.stop_container(c.id, 0) for c in self.for_pod(pod_id)))

    async def remove_pod_containers(self, pod_id: str) -> None:
        await asyncio.gather(*(self.remove_container(c.id) for c in self.for_pod(pod_id)))

    # -- logs, exec --------------------------------------------------------------------------
    async def reopen_log(self, cid: str) -> None:
        rec = self.get(cid)
        if rec.state != RUNNING:
            raise FailedPrecondition(f"container {rec.id} is not running; its log cannot be "
                                     "reopened")
        await conmon.reopen_log(rec.bundle)
        if rec.log_path and not await _wait_for_file(rec.log_path, REOPEN_WAIT):
            if not conmon.conmon_alive(rec.persist_dir):
                raise FailedPrecondition(f"the monitor of container {rec.id} is not running; "
                                         "its log cannot be reopened")
            raise Internal(f"conmon did not reopen {rec.log_path} within {REOPEN_WAIT:g}s")

    async def exec_sync(self, cid: str, cmd: list[str], limit_s: float) -> ExecResult:
        rec = self.get(cid)
        if not cmd:
            raise InvalidArgument("exec needs a command")
        if rec.state != RUNNING:
            raise FailedPrecondition(f"container {rec.id} is not running")
        spec = await asyncio.to_thread(oci_spec.read_bundle, rec.bundle)
        return await exec_sync(self.runtime_for(rec), rec.id,
                               exec_process(spec["process"], cmd), self.exec_dir, limit_s)

    # -- status ------------------------------------------------------------------------------
    def status_proto(self, rec: Container) -> pb.ContainerStatus:
        return rec.status_proto()

    async def verbose_info(self, rec: Container) -> dict[str, str]:
        try:
            spec = await asyncio.to_thread(oci_spec.read_bundle, rec.bundle)
        except (OSError, ValueError):
            spec = {}
        info = {
            "sandboxID": rec.pod_id, "pid": rec.pid if rec.state == RUNNING else 0,
            "removing": False, "snapshotKey": rec.id, "snapshotter": "overlayfs",
            "runtimeType": "io.crishim.runc-conmon", "runtimeHandler": rec.runtime_handler,
            "runtimeOptions": {"binary_name": self.runtime_for(rec).binary,
                               "root": self.runtime_for(rec).root},
            "config": json_format.MessageToDict(rec.config),
            "runtimeSpec": spec,
        }
        return {"info": json.dumps(info)}

    # -- reconcile ---------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Bring records in line with runc state, exit files and mounts after a restart."""
        records = await self.db.load_all(KIND)
        unreleased: list[Container] = []
        for cid, data in (await self.db.intents(KIND)).items():
            runtime = None
            with contextlib.suppress(InvalidArgument):
                runtime = self.runtimes.get(data.get("runtime", ""))
            if data.get("op") == "create":
                log.warning("rolling back interrupted container create", id=cid)
                await self._rollback(cid, data["bundle"], data["persist_dir"], runtime)
                await self.db.delete(KIND, cid)
            else:  # an interrupted remove: finish it
                log.warning("finishing interrupted container remove", id=cid)
                await self._rollback(cid, data["bundle"], data["persist_dir"], runtime)
                await self.db.delete(KIND, cid)
                image_ids = {(records.get(cid) or {}).get("image_id", "")}
                with contextlib.suppress(Exception):  # image volumes (a readable record)
                    image_ids |= _volume_image_ids(Container.from_dict(records[cid]).config)
                for image_id in image_ids - {""}:
                    self.images.unmark_used(image_id, cid)
            records.pop(cid, None)
            await self.db.remove_intent(cid)
        for cid, data in records.items():
            try:
                rec = Container.from_dict(data)
            except Exception:
                log.exception("unreadable container record dropped", id=cid)
                await self.db.delete(KIND, cid)
                continue
            self._containers[cid] = rec
            self._names[rec.name] = cid
            self._exited[cid] = asyncio.Event()
            if rec.state == EXITED:
                self._exited[cid].set()
                if not rec.released:
                    unreleased.append(rec)
                continue
            try:
                st = await self.runtime_for(rec).state(cid)
            except Exception as exc:
                log.warning("cannot read container state", id=cid, error=str(exc))
                st = None
            status = (st or {}).get("status", "")
            if status in ("running", "created", "paused"):
                if not conmon.conmon_alive(rec.persist_dir):
                    log.warning("container runs without its conmon; its exit code will be "
                                "lost", id=cid)
                changed = False
                if not rec.launched:  # the crash came between launch and saving the pid
                    rec.pid = int((st or {}).get("pid") or 0)
                    with contextlib.suppress(OSError, ValueError):
                        rec.conmon_pid = read_pid_file(
                            os.path.join(rec.persist_dir, "conmon.pid"))
                    changed = True
                if status == "running" and rec.state == CREATED:
                    rec.state, rec.started_at = RUNNING, rec.started_at or _now()
                    changed = True
                if changed:
                    await self._save(rec)
                self.watcher.watch(cid, self._on_exit)
                continue
            if rec.state == CREATED and not rec.launched and \
                    self.watcher.read_exit(cid) is None:
                self.watcher.watch(cid, self._on_exit)
                continue  # created, never started: nothing to reconcile
            res = self.watcher.read_exit(cid)
            if res is not None:
                await self._on_exit(cid, *res)
            else:
                # The container vanished without an exit file (e.g. the node rebooted).
                rec.state, rec.exit_code, rec.finished_at = EXITED, 255, _now()
                rec.reason, rec.message = "Unknown", "container disappeared while crishim " \
                    "was not running"
                self._exited[cid].set()
                await self._save(rec)
        await self._delete_orphan_containers()
        await self._unmount_orphans()
        await asyncio.to_thread(self._remove_orphan_monitor_files)
        # Exited before the crash, but not yet released (runc delete + unmount).
        for rec in unreleased:
            await self._release(rec)
            if rec.released:
                await self._save(rec)
        await self._forget_stale_image_users()

    async def _forget_stale_image_users(self) -> None:
        """An image keeps the ids of the containers using it; a container removed just
        before a crash may still be named there: drop every id no container or pod has."""
        self.images.forget_users_except(set(self._containers) | self.pods.ids())

    async def _delete_orphan_containers(self) -> None:
        """runc containers of ours (container-type "container") that no record owns."""
        for runtime, cid in await unowned_containers(self.runtimes, CONTAINER_TYPE,
                                                     self._containers):
            log.warning("deleting orphan container", id=cid, runtime=runtime.name)
            with contextlib.suppress(Exception):
                await runtime.kill(cid, signal.SIGKILL, all_procs=True)
                await runtime.delete(cid, force=True)
            conmon.kill_conmon(os.path.join(self.conmon_dir, cid))

    def _remove_orphan_monitor_files(self) -> None:
        """conmon's persist dirs, exit files and attach links that no container owns
        (RemoveContainer deletes them in the background; a crash can cut that short)."""
        for base in (self.conmon_dir, self.exit_dir):
            with contextlib.suppress(OSError):
                for name in os.listdir(base):
                    if name not in self._containers:
                        path = os.path.join(base, name)
                        if os.path.isdir(path) and not os.path.islink(path):
                            shutil.rmtree(path, ignore_errors=True)
                        else:
                            with contextlib.suppress(OSError):
                                os.unlink(path)
        socket_dir = conmon.default_socket_dir(os.path.join(self.conmon_dir, "x"))
        with contextlib.suppress(OSError):
            for name in os.listdir(socket_dir):
                link = os.path.join(socket_dir, name)
                if os.path.islink(link) and not os.path.exists(link):  # bundle is gone
                    with contextlib.suppress(OSError):
                        os.unlink(link)

    async def _unmount_orphans(self) -> None:
        known = {c.bundle for c in self._containers.values()}
        mounts = await asyncio.to_thread(rootfs_mod.mounted_under, self.containers_dir)
        for mp in mounts:
            # The bundle is the first level below containers/ (rootfs, image volumes).
            rel = mp[len(self.containers_dir):].strip("/")
            bundle = os.path.join(self.containers_dir, rel.split("/", 1)[0])
            if bundle not in known:
                log.warning("unmounting orphan container rootfs", path=mp)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(rootfs_mod.unmount, mp)
        with contextlib.suppress(OSError):
            for name in os.listdir(self.containers_dir):
                path = os.path.join(self.containers_dir, name)
                if path not in known:  # incl. the trash of removes a crash cut short
                    await self._remove_bundle(path)


async def _wait_for_file(path: str, limit: float) -> bool:
    """Poll (conmon's ctl fifo has no reply) until `path` exists; False after `limit` s."""
    deadline = time.monotonic() + limit
    delay = 0.002
    while not await asyncio.to_thread(os.path.exists, path):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def _volume_image_ids(config: pb.ContainerConfig) -> set[str]:
    """Images the container's image volumes were made from (resolved at create)."""
    return {m.image.image_ref for m in config.mounts
            if imagevolume.is_image_mount(m) and m.image.image_ref}


def _create_world_writable(path: str) -> None:
    with open(path, "a"):
        pass
    os.chmod(path, 0o666)  # the container user may not be root


def _existing(path: str) -> str:
    return path if os.path.exists(path) else ""

