"""CRI mounts that carry their own uid/gid mappings (`Mount.uidMappings`/`gidMappings`):
idmapped bind mounts. runc 1.1 has no OCI mount idmaps (1.2 added them), so crishim makes
each one itself at `<bundle>/idmapped/<n>` with the new mount API, and the spec binds that
into the container (a bind of an idmapped mount keeps its mapping). Living under the
bundle, they go away with the container's other mounts on release, remove, rollback and
reconcile.
"""

from __future__ import annotations

import asyncio
import os

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import FailedPrecondition
from crishim.host import idmap, modes
from crishim.oci.userns import parse_mappings

VOLUMES_DIR = "idmapped"


def is_idmapped(m: pb.Mount) -> bool:
    return bool(m.uidMappings or m.gidMappings)


def _maps(m: pb.Mount) -> tuple[tuple[idmap.Mapping, ...], tuple[idmap.Mapping, ...]]:
    what = f"idmapped mount {m.container_path}"
    return (parse_mappings("uid", m.uidMappings, what, need_root=False),
            parse_mappings("gid", m.gidMappings, what, need_root=False))


def _source(host_path: str) -> str:
    # Like any bind mount here: a missing host path becomes an empty directory, and a
    # symlink is mounted as what it points to.
    if not os.path.exists(host_path):
        modes.make_dir(host_path, 0o755)  # not the daemon's umask (host/modes.py)
    return os.path.realpath(host_path)


async def mount_all(config: pb.ContainerConfig, bundle: str) -> dict[int, str]:
    """Make every idmapped mount of `config` under `bundle`: index in config.mounts → the
    idmapped mount to bind. The caller unmounts everything under the bundle if this (or
    anything after it) fails."""
    out: dict[int, str] = {}
    for i, m in enumerate(config.mounts):
        if not is_idmapped(m):
            continue
        uids, gids = _maps(m)
        source = await asyncio.to_thread(_source, m.host_path)
        target = os.path.join(bundle, VOLUMES_DIR, str(i))
        try:
            # A read-only mount's flag is set here, where the pod cannot undo it
            # (host/idmap.py): the idmapped view writes as the ids it maps.
            await idmap.bind_idmapped([(source, target)], uids, gids,
                                      readonly=m.readonly)
        except OSError as exc:
            raise FailedPrecondition(f"mount {m.container_path}: cannot make an idmapped "
                                     f"mount of {source}: {exc}") from None
        out[i] = target
    return out
