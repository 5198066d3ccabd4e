"""Who may read what crishim keeps on the host: the daemon's umask, the modes of its
directories, and the tightening of an older install's.

The daemon runs with umask 077: whatever it creates without saying otherwise is root's
alone. What others must read gets its mode explicitly: the pod's hosts, resolv.conf and
hostname, a container's root directory (the overlay's upper dir), a missing host path
made for a mount. The processes it starts (runc, conmon, CNI plugins) get umask 022 on
the threads that start them, as under containerd: runc makes mount points inside the
container's rootfs with that umask before the container's own applies, and `runc exec`
passes it on to the exec'd process. They write only below directories that are private.

The roots and the directories that hold the bundles (`containers/`, `sandboxes/`) are
0711: others may pass through, never list. A pod in its own user namespace
runs runc's init as a non-root host uid that resolves its rootfs path through them
(containerd keeps its state dir 0711 for the same reason). Everything of one container
or pod is 0700, or 0710 with the group of the pod's root in a user namespace, which is
containerd's rule for a bundle: a setuid binary a container or an image put in its rootfs
cannot be reached by any other host user (containerd's CVE-2021-41103).
"""

from __future__ import annotations

import contextlib
import os
import stat

from crishim.host import libc
from crishim.log import get_logger

log = get_logger(__name__)

DAEMON_UMASK = 0o077
CHILD_UMASK = 0o022
PASS_THROUGH = 0o711  # the roots and the dirs holding bundles
PRIVATE = 0o700  # one container's or pod's dir, and every other dir of crishim's
POD_GROUP = 0o710  # the same in a user-namespaced pod, group = the pod's root group
PRIVATE_FILE = 0o600

_CLONE_FS = 0x200

# Directories below the roots that bundles live in (see the module's docstring).
ROOT_PASS_THROUGH = ("containers", "sandboxes")
# Another part of crishim owns these and their modes.
_ROOT_NOT_OURS = ("images",)


def set_daemon_umask() -> None:
    os.umask(DAEMON_UMASK)


def child_thread() -> None:
    """On a thread that starts processes: a umask of its own (the thread no longer shares
    the process's cwd/umask, CLONE_FS), CHILD_UMASK, which the processes it starts get."""
    try:
        libc.unshare(_CLONE_FS, "unshare(CLONE_FS) of a starter thread")
    except OSError as exc:
        # Still shared: a umask set here would be the whole daemon's.
        log.warning("processes crishim starts keep its umask", umask=oct(DAEMON_UMASK),
                    error=str(exc))
        return
    os.umask(CHILD_UMASK)


def bundle_mode(group: int | None) -> int:
    """The mode of one container's or pod's own dir: 0710 with the pod's root group in a
    user namespace (its init must reach the rootfs below), 0700 otherwise."""
    return POD_GROUP if group else PRIVATE


def make_dir(path: str, mode: int, group: int | None = None) -> None:
    """`mkdir -p path` where every dir made gets exactly `mode` (not the umask's cut of
    it). With `group`, `path` (new or not) becomes root:`group` and `mode`."""
    if not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent and parent != path and not os.path.isdir(parent):
            make_dir(parent, mode)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
            os.chmod(path, mode)
    if group is not None:
        os.chown(path, 0, group)
        os.chmod(path, mode)


def make_private_file(path: str, owner: tuple[int, int] | None = None) -> None:
    """Create `path` (if missing) as an empty 0600 file, owned by `owner` if given."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, PRIVATE_FILE)
    finally:
        os.close(fd)


def tightened(mode: int, allowed: int) -> int | None:
    """The permission bits `mode` keeps under `allowed`, or None when it grants nothing
    more than `allowed` already (nothing to change)."""
    perm = stat.S_IMODE(mode)
    if perm & ~allowed == 0:
        return None
    return perm & allowed


def _tighten(path: str, allowed: int) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        return
    new = tightened(st.st_mode, allowed)
    if new is not None:
        os.chmod(path, new)
        log.info("made private", path=path, mode=oct(new), was=oct(stat.S_IMODE(st.st_mode)))


def _tighten_bundles(parent: str) -> None:
    """Each `<parent>/<id>` dir private (0710 where its group is a pod's root group, as
    made for a user-namespaced pod), and its config.json (the container's env) 0600."""
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return
    for e in entries:
        if not e.is_dir(follow_symlinks=False):
            continue
        st = e.stat(follow_symlinks=False)
        _tighten(e.path, bundle_mode(st.st_gid))
        for spec in ("config.json", os.path.join("bundle", "config.json")):
            _tighten(os.path.join(e.path, spec), PRIVATE_FILE)
        _tighten(os.path.join(e.path, "bundle"), PRIVATE)


def tighten_install(root: str, state: str) -> None:
    """Make an older install's state as private as a new one's (idempotent): the roots
    and the dirs holding bundles 0711, every bundle 0700 (0710 with its pod's group),
    config.json 0600, every other dir and file of crishim's no more than 0700/0600.
    Blocking: call it through asyncio.to_thread."""
    for top in (root, state):
        make_dir(top, PASS_THROUGH)
        os.chmod(top, PASS_THROUGH)
    for name in ROOT_PASS_THROUGH:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            os.chmod(path, PASS_THROUGH)
    _tighten(os.path.join(root, "pause", "rootfs"), PASS_THROUGH)
    _tighten_bundles(os.path.join(root, "containers"))
    _tighten_bundles(os.path.join(root, "sandboxes"))
    for top, skip in ((root, (*ROOT_PASS_THROUGH, *_ROOT_NOT_OURS)), (state, ())):
        for e in os.scandir(top):
            if e.name in skip:
                continue
            if e.is_dir(follow_symlinks=False):
                _tighten(e.path, PRIVATE)
            elif e.is_file(follow_symlinks=False):
                _tighten(e.path, PRIVATE_FILE)
