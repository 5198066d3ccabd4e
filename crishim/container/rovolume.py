"""Read-only bind mounts of a user-namespaced container, read-only where the pod cannot
undo it.

runc makes a bind mount read-only by remounting it inside the container's mount
namespace. For a pod in a user namespace of its own that namespace belongs to the pod,
and a container with CAP_SYS_ADMIN there (harmless by design) may remount the bind
read-write and write, as the pod's host ids, whatever the host path lets them: a
world-writable file of a read-only hostPath, or of a CDI mount, shared with other pods
and the host. So for such a container every read-only bind of a path outside its bundle
(a CRI mount, a CDI or NRI one; the image and idmapped volumes under the bundle are
read-only there already) is first made at `<bundle>/ro/<n>` as a read-only copy in the
host's mount namespace (host/mount.py `bind_readonly`) and the spec binds that: the
container's mount namespace gets the flag locked. The copy is a slave of the host
path's mount: what the host mounts there still shows (HostToContainer), and unmounting
the copy's submounts with the bundle never unmounts the host's. A Bidirectional
(rshared) bind is left to the runtime: its mounts must reach the host. Living under the
bundle, the copies go away with the container's other mounts on release, remove,
rollback and reconcile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from crishim.host.mount import bind_readonly

DIR = "ro"


@dataclass(frozen=True)
class ReadonlyBind:
    index: int  # in spec["mounts"]
    source: str
    target: str  # <bundle>/ro/<index>
    recursive_bind: bool  # rbind: the host path's submounts come along
    recursive_readonly: bool  # rro: they are read-only too


def _under(path: str, directory: str) -> bool:
    return os.path.normpath(path).startswith(directory.rstrip("/") + "/")


def plan(spec: dict[str, Any], bundle: str) -> list[ReadonlyBind]:
    """The read-only binds of `spec` to make under `bundle` (pure)."""
    out = []
    for i, m in enumerate(spec.get("mounts") or []):
        opts = m.get("options") or []
        bind = m.get("type") == "bind" or "bind" in opts or "rbind" in opts
        if not bind or not ("ro" in opts or "rro" in opts):
            continue
        if "rshared" in opts or "shared" in opts:
            continue
        source = str(m.get("source") or "")
        if not os.path.isabs(source) or _under(source, bundle):
            continue
        out.append(ReadonlyBind(index=i, source=source,
                                target=os.path.join(bundle, DIR, str(i)),
                                recursive_bind="rbind" in opts,
                                recursive_readonly="rro" in opts))
    return out


def lock_readonly(spec: dict[str, Any], bundle: str) -> None:
    """Make each read-only bind of `spec` a locked one under `bundle` and point the spec at
    it. Blocking. The caller unmounts everything under the bundle if this fails."""
    mounts = spec.get("mounts") or []
    for b in plan(spec, bundle):
        if not os.path.exists(b.source):
            continue  # the runtime reports it, as for any other bind
        bind_readonly(b.source, b.target, recursive_bind=b.recursive_bind,
                      recursive_readonly=b.recursive_readonly)
        mounts[b.index]["source"] = b.target


def made(bundle: str) -> bool:
    """Whether read-only copies may be mounted under `bundle`."""
    return os.path.isdir(os.path.join(bundle, DIR))
