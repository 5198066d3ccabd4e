"""The gRPC server on the unix socket: lifecycle, socket safety, signals."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Protocol

import grpc

from crishim.config import Config
from crishim.cri.handlers import add_service, rpc_methods
from crishim.cri.image import ImageService
from crishim.cri.runtime import RuntimeService
from crishim.host import apparmor as host_apparmor
from crishim.host import facts as host_facts
from crishim.host import modes
from crishim.host import tools as host_tools
from crishim.log import get_logger
from crishim.node.daemon import Daemon
from crishim.observe import tracing
from crishim.proc import heap, priority
from crishim.rpc import server as rpc
from crishim.rpc.limits import Limits
from crishim.rpc.method import Method
from crishim.runtime import apparmor

log = get_logger(__name__)

# The kubelet sends and accepts CRI messages up to 16 MiB.
MAX_MESSAGE = 16 * 1024 * 1024


class StartupError(Exception):
    """The daemon cannot start; the message tells the operator why."""


def _socket_is_live(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _take_lock(state: str) -> IO[bytes]:
    """One daemon per state dir: a second one fails fast instead of stealing the socket."""
    modes.make_dir(state, modes.PASS_THROUGH)
    fh = open(os.path.join(state, "crishim.lock"), "ab")  # held for the life of the daemon
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise StartupError(f"another crishim is running with state dir {state}") from None
    return fh


# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


def _prepare_socket(path: str) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise StartupError(f"socket path {path} is {len(os.fsencode(path))} bytes; unix "
                           f"sockets allow at most {MAX_SOCKET_PATH}: choose a shorter --listen")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        modes.make_dir(parent, modes.PASS_THROUGH)
    if os.path.exists(path) or os.path.islink(path):
        if _socket_is_live(path):
            raise StartupError(f"socket {path} is served by another process; "
                               "stop it or choose another --listen")
        os.unlink(path)  # stale socket from a crashed daemon


def _sd_notify(message: str) -> None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(message.encode(), addr)


def _raise_priority(nice: int) -> None:
    """Once the serving threads (event loop, database, grpcio's when it serves) exist: see
    proc/priority.py for why."""
    if nice == 0:
        return
    try:
        threads = priority.raise_threads(nice)
    except PermissionError as exc:  # no CAP_SYS_NICE (e.g. inside a container)
        log.warning("cannot raise the daemon's CPU priority; it competes with the "
                    "processes it starts", nice=nice, error=str(exc))
        return
    try:
        short = priority.set_slice(os.getpid(), priority.LOOP_SLICE_NS)
    except OSError as exc:
        log.warning("cannot shorten the event loop's time slice", error=str(exc))
        short = False
    log.info("daemon CPU priority raised", nice=nice, threads=len(threads),
             session=priority.raise_session(nice),
             loop_slice_us=priority.LOOP_SLICE_NS // 1000 if short else None)


class _Serving(Protocol):
    async def start(self, path: str) -> None: ...
    async def stop(self, grace: float) -> None: ...


class _GrpcioServer:
    def __init__(self, services: list[tuple[str, Any]], max_streams: int) -> None:
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_concurrent_streams", max_streams),
        ])
        for name, servicer in services:
            add_service(self._server, name, servicer)

    async def start(self, path: str) -> None:
        self._server.add_insecure_port(f"unix:{path}")
        await self._server.start()

    async def stop(self, grace: float) -> None:
        await self._server.stop(grace=grace)


def _make_server(cfg: Config, daemon: Daemon) -> _Serving:
    services: list[tuple[str, Any]] = [(RuntimeService.SERVICE, RuntimeService(daemon)),
                                       (ImageService.SERVICE, ImageService(daemon))]
    if cfg.grpc_server == "native":
        methods: dict[str, Method] = {}
        for name, servicer in services:
            methods |= rpc_methods(name, servicer)
        return rpc.Server(methods, MAX_MESSAGE, Limits(
            cfg.grpc_max_connections, cfg.grpc_max_concurrent_streams,
            cfg.grpc_connection_window, cfg.grpc_max_buffered))
    return _GrpcioServer(services, cfg.grpc_max_concurrent_streams)


async def serve(cfg: Config) -> int:
    path = cfg.socket_path
    # Nothing crishim stores is for other host users; what must be is given its mode.
    modes.set_daemon_umask()
    # Workers at the daemon's priority (proc/priority.py), made before any is needed.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
        thread_name_prefix="worker", initializer=priority.follow_main_thread))
    lock = _take_lock(cfg.state)
    tracing.setup(cfg.tracing)
    try:
        _prepare_socket(path)
        # The runtimes' versions come from their own probe (Daemon.start).
        daemon = Daemon(cfg, await asyncio.to_thread(host_facts.probe, cfg),
                        await apparmor.setup(cfg.apparmor_profile,
                                             await asyncio.to_thread(host_apparmor.probe)),
                        await host_tools.probe({"conmon": cfg.conmon_path}))
        with tracing.span("crishim start"):
            await daemon.start()
        server = _make_server(cfg, daemon)
        old_umask = os.umask(0o117)  # socket born 0660: root (and its group) only
        try:
            await server.start(path)
        except (RuntimeError, OSError) as exc:  # the bind failed
            raise StartupError(f"cannot listen on {path}: {exc}") from None
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o660)
        _raise_priority(cfg.daemon_nice)
        frozen = heap.freeze_startup_objects()
        log.info("serving", listen=cfg.listen, grpc_server=cfg.grpc_server, root=cfg.root,
                 state=cfg.state, frozen_objects=frozen)
        _sd_notify("READY=1")

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down", drain_seconds=cfg.drain_timeout)
        _sd_notify("STOPPING=1")
        daemon.events.close()  # end GetContainerEvents streams; they never finish alone
        await server.stop(grace=cfg.drain_timeout)
        await daemon.stop()
        await asyncio.to_thread(tracing.shutdown)  # the spans not sent yet
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        log.info("stopped")
        return 0
    finally:
        lock.close()
