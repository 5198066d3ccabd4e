"""CheckpointPod: a pod's containers in one cut, as a directory of container archives.

All the selected containers are paused (cgroup freezer) before the first is dumped and
all are resumed before the call returns, however it ends: their memory and files are one
moment of the pod. `output_path` is a directory this call makes (exclusively, in a
directory that exists); it holds `pod.dump` (JSON: the pod's identity and which archive
is which container) and one archive per container (`<container id>.tar`, the layout of
ckptarchive.py), and is removed whole when the call fails. The parts are gathered in
private dirs under crishim's root first, as for a container checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from typing import Any

from crishim.container import ckptarchive as ar
from crishim.container.checkpoint import DEFAULT_TIMEOUT, Capture
from crishim.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
)
from crishim.log import get_logger
from crishim.runtime.runc import OCIRuntime
from crishim.store.container import Container
from crishim.store.sandbox import Sandbox

log = get_logger(__name__)

POD_DUMP = "pod.dump"
MAX_POD_DUMP = 1 << 20
_ARCHIVE = re.compile(r"[0-9a-f]{64}\.tar")


def archive_name(cid: str) -> str:
    return f"{cid}.tar"


def pod_dump(sb: Sandbox, recs: list[Container], now_ns: int) -> dict[str, Any]:
    meta = sb.config.metadata
    return {"podSandboxId": sb.id, "name": meta.name, "namespace": meta.namespace,
            "uid": meta.uid, "runtimeHandler": sb.runtime_handler,
            "checkpointedTime": ar.rfc3339(now_ns),
            "containers": [{"name": r.config.metadata.name, "id": r.id,
                            "archive": archive_name(r.id)} for r in recs]}


def make_output(path: str) -> None:
    parent = os.path.dirname(path) or "/"
    if not os.path.isdir(parent):
        raise FailedPrecondition(f"output_path {path}: directory {parent} does not exist")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise AlreadyExists(f"output_path {path} already exists; a checkpoint never "
                            "writes into an existing path") from None


async def checkpoint_pod(sb: Sandbox, recs: list[tuple[Container, OCIRuntime]],
                         lock: Callable[[str], asyncio.Lock], work_root: str,
                         output: str) -> None:
    """Checkpoint `recs` into the new directory `output`, holding each one's `lock`."""
    if not recs:
        raise FailedPrecondition(f"pod {sb.id} has no running container to checkpoint")
    async with contextlib.AsyncExitStack() as stack:
        for rec, _ in sorted(recs, key=lambda r: r[0].id):  # one order: no deadlock
            await stack.enter_async_context(lock(rec.id))
        await _checkpoint_pod(sb, recs, work_root, output)


async def _checkpoint_pod(sb: Sandbox, recs: list[tuple[Container, OCIRuntime]],
                          work_root: str, output: str) -> None:
    t0 = time.monotonic()
    await asyncio.to_thread(make_output, output)
    caps: list[Capture] = []
    paused: list[Capture] = []
    try:
        for rec, runtime in recs:
            caps.append(await Capture.begin(rec, runtime, work_root))
        try:
            for cap in caps:
                await cap.pause()
                paused.append(cap)
            for cap in caps:
                left = DEFAULT_TIMEOUT - (time.monotonic() - t0)
                if left <= 0:
                    raise DeadlineExceeded(f"checkpoint of pod {sb.id} took longer than "
                                           f"{DEFAULT_TIMEOUT:g}s")
                await cap.dump(left)
        finally:
            # Every container runs again before the call returns, whatever failed.
            await asyncio.shield(_resume_all(paused))
        for cap in caps:
            await cap.write(os.path.join(output, archive_name(cap.rec.id)))
        await asyncio.to_thread(ar.write_json, os.path.join(output, POD_DUMP),
                                pod_dump(sb, [c.rec for c in caps], time.time_ns()))
    except BaseException:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, output, True))
        raise
    finally:
        for cap in caps:
            await cap.discard()
    log.info("pod checkpointed", id=sb.id, containers=len(caps), output=output,
             seconds=round(time.monotonic() - t0, 2))


async def _resume_all(paused: list[Capture]) -> None:
    results = await asyncio.gather(*(c.resume() for c in paused), return_exceptions=True)
    for cap, res in zip(paused, results, strict=True):
        if isinstance(res, BaseException):
            log.error("container not resumed after a pod checkpoint", id=cap.rec.id,
                      error=str(res))


def _bad(path: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"pod checkpoint {path}: {why}")


def read_pod_dump(path: str) -> dict[str, str]:
    """{container name: its archive's path} from a pod checkpoint directory. The
    directory is untrusted input: each archive must be a regular file directly in it,
    named as CheckpointPod names them."""
    try:
        fd = os.open(os.path.join(path, POD_DUMP), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FailedPrecondition(f"pod checkpoint {path}: no {POD_DUMP}") from None
    except OSError as exc:
        raise _bad(path, f"{POD_DUMP}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _bad(path, f"{POD_DUMP} is not a regular file")
        raw = f.read(MAX_POD_DUMP + 1)
    if len(raw) > MAX_POD_DUMP:
        raise _bad(path, f"{POD_DUMP} is larger than {MAX_POD_DUMP} bytes")
    try:
        dump = json.loads(raw)
    except ValueError as exc:
        raise _bad(path, f"{POD_DUMP} is not JSON: {exc}") from None
    entries = dump.get("containers") if isinstance(dump, dict) else None
    if not isinstance(entries, list) or not entries:
        raise _bad(path, f"{POD_DUMP} lists no containers")
    out: dict[str, str] = {}
    for e in entries:
        name = e.get("name") if isinstance(e, dict) else None
        archive = e.get("archive") if isinstance(e, dict) else None
        if not isinstance(name, str) or not name or name in out:
            raise _bad(path, f"{POD_DUMP}: a container without a name, or twice: {name!r}")
        if not isinstance(archive, str) or not _ARCHIVE.fullmatch(archive):
            raise _bad(path, f"{POD_DUMP}: container {name!r} has archive {archive!r}, "
                       "not <id>.tar")
        full = os.path.join(path, archive)
        try:
            st = os.lstat(full)
        except OSError:
            raise _bad(path, f"the archive of container {name!r} is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise _bad(path, f"the archive of container {name!r} is not a regular file")
        out[name] = full
    return out


def match(path: str, archives: dict[str, str], names: list[str]) -> None:
    """The request's containers are the checkpoint's, by name, no more and no fewer."""
    missing = sorted(set(archives) - set(names))
    extra = sorted(set(names) - set(archives))
    if missing or extra:
        raise InvalidArgument(
            f"pod checkpoint {path} does not match the request's container_configs"
            + (f"; not in the request: {', '.join(missing)}" if missing else "")
            + (f"; not in the checkpoint: {', '.join(extra)}" if extra else ""))
