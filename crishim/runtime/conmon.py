"""Create containers through conmon, the per-container monitor (Debian's conmon 2.1.x).

conmon runs `<runtime> create` for a bundle, then stays alive as the container's parent:
it keeps its stdio (log file + attach socket), and writes the exit code to
`<exit_dir>/<container id>` when the container dies. It daemonizes itself (fork + setsid),
so it outlives crishim; crishim finds everything again from files.

Protocol (see conmon's src/conmon.c and parent_pipe_fd.c): the fd number in the env var
`_OCI_SYNCPIPE` is a pipe on which conmon writes one JSON line once the runtime's `create`
finished: `{"pid": <container pid>}` or `{"pid": -1, "message": "<runtime stderr>"}`.
Files conmon makes: `<bundle>/ctl` (control fifo: "1 <h> <w>\\n" resizes the tty,
"2 0 0\\n" reopens the log file), `<socket_dir>/<cuuid>` → symlink to the bundle, with the
SEQPACKET attach socket `<bundle>/attach`, and `<persist_dir>/exit` + `oom`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from crishim.errors import FailedPrecondition, NotFound
from crishim.host import logfiles, remove
from crishim.log import get_logger
from crishim.observe import metrics, tracing
from crishim.proc import spawn
from crishim.runtime.runc import (
    OCIRuntime,
    OCIRuntimeError,
    last_log_error,
    read_pid_file,
    read_small,
)

log = get_logger(__name__)

# A unix socket path is limited to 108 bytes including the NUL.
_SUN_PATH_MAX = 107
CREATE_TIMEOUT = 60.0


@dataclass
class MonitorRequest:
    container_id: str
    bundle: str
    runtime: OCIRuntime
    # '' → /dev/null (the pause has nothing to log).
    log_path: str
    exit_dir: str
    persist_dir: str
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    log_size_max: int = -1
    # Where the attach-socket symlink lives; '' → <dirname(persist_dir)>/../attach.
    socket_dir: str = ""
    conmon_path: str = "conmon"
    name: str = ""
    log_level: str = "info"
    extra_env: dict[str, str] = field(default_factory=dict)
    timeout: float = CREATE_TIMEOUT
    # The pod's log directory, below which nothing of log_path is followed ('' → its dir).
    log_dir: str = ""
    # CRIU's images: `<runtime> restore` of them instead of `<runtime> create`.
    restore_path: str = ""
    # The daemon's roots (host/remove.py): conmon's files outside them are never deleted.
    roots: Sequence[str] = field(kw_only=True)


@dataclass
class Created:
    pid: int
    conmon_pid: int


def default_socket_dir(persist_dir: str) -> str:
    return os.path.join(os.path.dirname(os.path.dirname(persist_dir)), "attach")


def attach_cuuid(socket_dir: str, container_id: str) -> str:
    """The name conmon gives the attach symlink: the id, shortened if the path is too long."""
    room = _SUN_PATH_MAX - len(socket_dir) - len("/attach") - 1
    if room < 12:
        raise FailedPrecondition(f"attach socket dir {socket_dir!r} is too long for a unix "
                                 "socket path; use a shorter state dir")
    return container_id[:room]


def attach_socket_path(socket_dir: str, container_id: str) -> str:
    """Path of conmon's attach socket (SOCK_SEQPACKET) for streaming Attach."""
    return os.path.join(socket_dir, attach_cuuid(socket_dir, container_id), "attach")


def runtime_log_path(persist_dir: str) -> str:
    """The runtime's own log (JSON lines) for a container conmon created."""
    return os.path.join(persist_dir, "runtime.log")


def ctl_fifo_path(bundle: str) -> str:
    return os.path.join(bundle, "ctl")


def conmon_args(req: MonitorRequest) -> list[str]:
    socket_dir = req.socket_dir or default_socket_dir(req.persist_dir)
    log_path = req.log_path or "/dev/null"
    args = [
        shutil.which(req.conmon_path) or req.conmon_path,
        "--cid", req.container_id,
        "--cuuid", attach_cuuid(socket_dir, req.container_id),
        "--name", req.name or req.container_id,
        *req.runtime.monitor_args(runtime_log_path(req.persist_dir)),
        "--bundle", req.bundle,
        "--container-pidfile", os.path.join(req.persist_dir, "pidfile"),
        "--conmon-pidfile", os.path.join(req.persist_dir, "conmon.pid"),
        "--log-path", f"k8s-file:{log_path}",
        "--exit-dir", req.exit_dir,
        "--persist-dir", req.persist_dir,
        "--socket-dir-path", socket_dir,
        "--log-level", req.log_level,
    ]
    if req.log_size_max > 0:
        args += ["--log-size-max", str(req.log_size_max)]
    if req.stdin:
        args.append("--stdin")
        if not req.stdin_once:
            args.append("--leave-stdin-open")
    if req.tty:
        args.append("--terminal")
    if req.restore_path:
        args += ["--restore", req.restore_path]
    return args


_LOGRUS_MSG = re.compile(r'msg="((?:[^"\\]|\\.)*)"')


def runtime_reason(stderr: str) -> str:
    """The human part of runc's stderr (a logrus line `time=... level=error msg="..."`)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "no error message"
    last = lines[-1]
    m = _LOGRUS_MSG.search(last)
    if m:
        try:
            return str(json.loads('"' + m.group(1) + '"'))
        except ValueError:
            return m.group(1)
    return last




async def _cleanup_failed(req: MonitorRequest, socket_dir: str) -> None:
    """Leave nothing behind after a failed create: container, conmon, files."""
    conmon_pid = read_pid_file(os.path.join(req.persist_dir, "conmon.pid"))
    with contextlib.suppress(OCIRuntimeError):
        await req.runtime.delete(req.container_id, force=True)
    if conmon_pid > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(conmon_pid, signal.SIGKILL)
    await remove_monitor_files(req.container_id, req.bundle, req.persist_dir, req.exit_dir,
                               socket_dir, roots=req.roots)


async def create(req: MonitorRequest) -> Created:
    """Start conmon, which runs `<runtime> create`; return once the container exists.

    The container is then in the "created" state: call `runtime.start(id)` to run it.
    On failure raises OCIRuntimeError with the runtime's message, and cleans up.
    """
    with tracing.span(f"conmon {req.runtime.name} create", **{
            "oci.runtime": req.runtime.name, "oci.container_id": req.container_id}), \
            metrics.timed(metrics.OCI_RUNTIME_DURATION, req.runtime.name, "conmon_create"):
        return await _create(req)


async def _create(req: MonitorRequest) -> Created:
    socket_dir = req.socket_dir or default_socket_dir(req.persist_dir)
    await asyncio.to_thread(_prepare_files, req, socket_dir)
    args = conmon_args(req)
    rfd, wfd = os.pipe()
    env = {"PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                                  "/sbin:/bin"),
           "_OCI_SYNCPIPE": str(wfd), **req.extra_env}
    try:
        proc = await spawn.start(args, stderr=spawn.PIPE, env=env, pass_fds=(wfd,),
                                 cwd=req.persist_dir, start_new_session=True)
    except OSError as exc:
        os.close(rfd)
        os.close(wfd)
        raise OCIRuntimeError(f"cannot run conmon {req.conmon_path!r}: {exc}") from None
    os.close(wfd)  # only conmon holds the write end now: EOF means it died
    try:
        message = await asyncio.wait_for(_read_sync(rfd, proc), req.timeout)
    except TimeoutError:
        await _cleanup_failed(req, socket_dir)
        raise OCIRuntimeError(f"{req.runtime.name} create {req.container_id} did not finish "
                              f"within {req.timeout}s") from None
    except OCIRuntimeError:
        await _cleanup_failed(req, socket_dir)
        raise
    finally:
        os.close(rfd)
    pid = int(message.get("pid", message.get("data", -1)))
    if pid <= 0:
        raw = str(message.get("message", "")).strip()
        # The runtime's reason is in its log; conmon's message is the fallback.
        logged = last_log_error(await asyncio.to_thread(
            read_small, runtime_log_path(req.persist_dir)))
        await _cleanup_failed(req, socket_dir)
        reason = logged or runtime_reason(raw)
        if not reason.startswith(req.runtime.name):
            reason = f"{req.runtime.name} create failed: {reason}"
        raise OCIRuntimeError(reason, stderr=raw)
    conmon_pid = read_pid_file(os.path.join(req.persist_dir, "conmon.pid"))
    log.debug("container created", id=req.container_id, pid=pid, conmon_pid=conmon_pid)
    return Created(pid=pid, conmon_pid=conmon_pid)


def _prepare_files(req: MonitorRequest, socket_dir: str) -> None:
    """The directories conmon writes in (the log's too: below /var/log, on disk, where a
    mkdir can wait for I/O), and no exit file left by an earlier container of this id:
    it would read as this one's exit."""
    for d in (req.exit_dir, req.persist_dir, socket_dir):
        os.makedirs(d, mode=0o700, exist_ok=True)
    if req.log_path:
        # Outside crishim's roots: the pod log dir's usual mode, not the daemon's umask;
        # made and checked without following a link a pod could have planted there.
        pod_dir = req.log_dir or os.path.dirname(req.log_path)
        logfiles.prepare_log(pod_dir, os.path.relpath(req.log_path, pod_dir), 0o755)
    remove.unlink(os.path.join(req.exit_dir, req.container_id), req.roots)


async def _read_sync(rfd: int, proc: spawn.Child) -> dict[str, Any]:
    """Read conmon's one JSON line from the sync pipe (EOF → conmon failed)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    # Dup so the transport can own (and close) its fd independently of ours.
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(rfd), "rb", 0))
    try:
        line = await reader.readline()
    finally:
        transport.close()
    # The first conmon process exits right after its fork; reap it and keep its stderr.
    err = (await proc.communicate())[1].decode(errors="replace").strip()
    if not line.strip():
        raise OCIRuntimeError(f"conmon exited (status {proc.returncode}) without reporting the "
                              f"container: {err or 'no error message'}", stderr=err)
    try:
        data = json.loads(line)
    except ValueError:
        raise OCIRuntimeError(f"conmon sent an unreadable sync message: {line!r}") from None
    if not isinstance(data, dict):
        raise OCIRuntimeError(f"conmon sent an unexpected sync message: {line!r}")
    return data


def _write_ctl(bundle: str, message: str) -> None:
    path = ctl_fifo_path(bundle)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotFound(f"conmon control fifo {path} does not exist; is the container "
                       "running?") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader: conmon is gone
            raise FailedPrecondition(f"conmon for {bundle} is not running") from None
        raise
    try:
        os.write(fd, message.encode())
    finally:
        os.close(fd)


async def reopen_log(bundle: str) -> None:
    """Ask conmon to reopen the container log file (after the kubelet rotated it). conmon
    acts on it later and does not answer: container/logreopen.py waits for the file."""
    await asyncio.to_thread(_write_ctl, bundle, "2 0 0\n")


async def resize_tty(bundle: str, height: int, width: int) -> None:
    await asyncio.to_thread(_write_ctl, bundle, f"1 {height} {width}\n")


def conmon_alive(persist_dir: str) -> bool:
    """Whether the conmon recorded in persist_dir is still running."""
    pid = read_pid_file(os.path.join(persist_dir, "conmon.pid"))
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    # "<pid> (<comm>) <state> ...": a zombie is as dead as a missing process.
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    state = stat[stat.rfind(")") + 2:][:1]
    return comm == "conmon" and state not in ("Z", "X")


def kill_conmon(persist_dir: str) -> None:
    """SIGKILL a leftover conmon (e.g. of a container whose create was interrupted)."""
    if conmon_alive(persist_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(read_pid_file(os.path.join(persist_dir, "conmon.pid")), signal.SIGKILL)


async def remove_monitor_files(container_id: str, bundle: str, persist_dir: str,
                               exit_dir: str = "", socket_dir: str = "", *,
                               roots: Sequence[str]) -> None:
    """Remove what conmon left for a deleted container (idempotent); nothing outside
    `roots` (the daemon's: a refusal is logged, the rest still removed)."""
    await asyncio.to_thread(remove_monitor_files_sync, container_id, bundle, persist_dir,
                            exit_dir, socket_dir, roots=roots)


def remove_monitor_files_sync(container_id: str, bundle: str, persist_dir: str,
                              exit_dir: str = "", socket_dir: str = "", *,
                              roots: Sequence[str]) -> None:
    """`remove_monitor_files` for callers already off the event loop."""
    socket_dir = socket_dir or default_socket_dir(persist_dir)
    with contextlib.suppress(OSError, FailedPrecondition, remove.OutsideRoots):
        remove.unlink(os.path.join(socket_dir, attach_cuuid(socket_dir, container_id)), roots)
    for name in ("ctl", "winsz", "attach"):
        with contextlib.suppress(OSError, remove.OutsideRoots):
            remove.unlink(os.path.join(bundle, name), roots)
    if exit_dir:
        with contextlib.suppress(OSError, remove.OutsideRoots):
            remove.unlink(os.path.join(exit_dir, container_id), roots)
    with contextlib.suppress(OSError, remove.OutsideRoots):
        remove.remove(persist_dir, roots)
