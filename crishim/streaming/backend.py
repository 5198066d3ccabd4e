"""The real streaming backend: runc exec, conmon attach, dialing into the pod's netns.

Exec runs `runc exec --process <json>` in the foreground, so runc's exit status is the
command's. With a tty, runc's stdio is the slave of a pty we allocate: runc creates the
container-side terminal and copies between the two; a resize is applied to our pty and
signalled to runc with SIGWINCH (runc then copies the size to the container terminal).
When the client goes away the exec'd process is killed and reaped by runc
(crishim.runtime.execproc).

Attach connects to conmon's attach socket (SOCK_SEQPACKET): packets from conmon start with
a pipe byte (2 stdout, 3 stderr); what we write goes to the container's stdin. Resizes go
through conmon's control fifo. Sessions without stdin share one connection per container
(streaming/attachhub.py: conmon keeps a gone client's socket until the container prints).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol

from crishim.container.execsync import exec_process
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.network.netns import in_netns
from crishim.oci import spec as oci_spec
from crishim.proc import spawn
from crishim.runtime import conmon
from crishim.runtime.execproc import ExecProcess, run_exec
from crishim.runtime.runc import OCIRuntime
from crishim.store.container import RUNNING
from crishim.streaming import ptyio, seqpacket
from crishim.streaming.attachhub import AttachHub
from crishim.streaming.interface import ByteSink, ByteSource, TerminalSize
from crishim.streaming.resizes import TerminalResizes

ATTACH_PIPE_STDOUT = 2
ATTACH_PIPE_STDERR = 3
ATTACH_PACKET = 32 * 1024 + 1
DIAL_TIMEOUT = 10.0


class ContainersLike(Protocol):
    exec_dir: str

    def get(self, cid: str) -> Any: ...

    def runtime_for(self, rec: Any) -> OCIRuntime: ...


class SandboxesLike(Protocol):
    def get(self, sid: str) -> Any: ...


def running_container(containers: ContainersLike, cid: str) -> Any:
    rec = containers.get(cid)
    if rec.state != RUNNING:
        raise FailedPrecondition(f"container {rec.id} is not running")
    return rec


async def _pump_reader(reader: asyncio.StreamReader, sink: ByteSink | None) -> None:
    while data := await reader.read(65536):
        if sink is not None:
            await sink.write(data)
    if sink is not None:
        await sink.close()


async def _feed_writer(src: ByteSource, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(32 * 1024):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # the process closed its stdin
    finally:
        writer.close()




async def _connect_attach(cid: str, path: str) -> socket.socket:
    """A connection to conmon's attach socket at `path`."""
    try:
        return await seqpacket.connect(path)
    except OSError as exc:
        raise FailedPrecondition(f"cannot attach to container {cid}: conmon attach "
                                 f"socket {path}: {exc}") from None


async def _deliver(packet: bytes, stdout: ByteSink | None, stderr: ByteSink | None) -> None:
    """A packet from conmon to its sink: the first byte says which pipe."""
    pipe, data = packet[0], packet[1:]
    sink = stdout if pipe == ATTACH_PIPE_STDOUT else \
        stderr if pipe == ATTACH_PIPE_STDERR else None
    if sink is not None and data:
        await sink.write(data)


class ContainerBackend:
    def __init__(self, containers: ContainersLike, sandboxes: SandboxesLike) -> None:
        self.containers = containers
        self.sandboxes = sandboxes
        self.attach_hub = AttachHub()
        self.resizes = TerminalResizes(conmon.resize_tty)

    # -- exec

    async def exec(self, container_id: str, cmd: list[str], tty: bool,
                   stdin: ByteSource | None, stdout: ByteSink | None,
                   stderr: ByteSink | None,
                   resize: AsyncIterator[TerminalSize] | None) -> int:
        rec = running_container(self.containers, container_id)
        if not cmd:
            raise InvalidArgument("exec needs a command")
        spec = await asyncio.to_thread(oci_spec.read_bundle, rec.bundle)
        process = exec_process(spec["process"], cmd, tty)
        runtime = self.containers.runtime_for(rec)
        if tty:
            return await self._exec_tty(runtime, rec.id, process, stdin, stdout, resize)
        return await self._exec_pipes(runtime, rec.id, process, stdin, stdout, stderr)

    async def _run_to_exit(self, ex: ExecProcess, pumps: list[asyncio.Task[None]],
                           outputs: int) -> int:
        """Wait for the runtime (and the first `outputs` pumps); if cancelled (the client
        went away), kill the exec'd process first, then stop the pumps."""
        try:
            code = await ex.proc.wait()
            # Output still in the pipes reaches the client before the exit status.
            if outputs:
                await asyncio.wait(pumps[:outputs], timeout=10)
            return code
        finally:
            await asyncio.shield(ex.terminate())
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _exec_pipes(self, runtime: OCIRuntime, cid: str, process: dict[str, Any],
                          stdin: ByteSource | None, stdout: ByteSink | None,
                          stderr: ByteSink | None) -> int:
        async with run_exec(
                runtime, cid, process, self.containers.exec_dir,
                stdin=spawn.PIPE if stdin else spawn.DEVNULL,
                stdout=spawn.PIPE, stderr=spawn.PIPE) as ex:
            assert ex.stdout is not None and ex.stderr is not None
            pumps = [asyncio.create_task(_pump_reader(ex.stdout, stdout)),
                     asyncio.create_task(_pump_reader(ex.stderr, stderr))]
            if stdin is not None:
                assert ex.stdin is not None
                pumps.append(asyncio.create_task(_feed_writer(stdin, ex.stdin)))
            return await self._run_to_exit(ex, pumps, outputs=2)

    async def _exec_tty(self, runtime: OCIRuntime, cid: str, process: dict[str, Any],
                        stdin: ByteSource | None, stdout: ByteSink | None,
                        resize: AsyncIterator[TerminalSize] | None) -> int:
        master, slave = os.openpty()
        try:
            ptyio.set_winsize(master, TerminalSize(80, 24))
            async with run_exec(runtime, cid, process, self.containers.exec_dir,
                                stdin=slave, stdout=slave, stderr=slave) as ex:
                os.close(slave)  # the runtime holds it now
                slave = -1
                ptyio.set_nonblocking(master)
                pumps = [asyncio.create_task(ptyio.pump_out(master, stdout))]
                if stdin is not None:
                    pumps.append(asyncio.create_task(ptyio.pump_in(stdin, master, tty=True)))
                if resize is not None:
                    pumps.append(asyncio.create_task(
                        self._tty_resizes(master, ex.proc, resize)))
                return await self._run_to_exit(ex, pumps, outputs=1)
        finally:
            if slave >= 0:
                os.close(slave)
            os.close(master)

    async def _tty_resizes(self, master: int, proc: spawn.Child,
                           sizes: AsyncIterator[TerminalSize]) -> None:
        async for size in sizes:
            if size.width <= 0 or size.height <= 0:
                continue
            with contextlib.suppress(OSError):
                ptyio.set_winsize(master, size)
            # runc copies its stdin terminal's size to the container's on SIGWINCH.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGWINCH)

    # -- attach

    async def attach(self, container_id: str, tty: bool, stdin: ByteSource | None,
                     stdout: ByteSink | None, stderr: ByteSink | None,
                     resize: AsyncIterator[TerminalSize] | None) -> None:
        rec = running_container(self.containers, container_id)
        if stdin is not None and not rec.config.stdin:
            stdin = None  # the container has no stdin to attach to
        path = conmon.attach_socket_path(conmon.default_socket_dir(rec.persist_dir), rec.id)
        if stdin is None:
            # Read-only: one connection shared by all such sessions (streaming/attachhub.py).
            await self._attach_shared(rec, path, tty, stdout, stderr, resize)
            return
        sock = await _connect_attach(rec.id, path)
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        try:
            if stdin is not None:
                tasks.append(asyncio.create_task(self._attach_stdin(sock, stdin)))
            if resize is not None and tty:
                tasks.append(asyncio.create_task(self._attach_resizes(rec.bundle, resize)))
            while packet := await loop.sock_recv(sock, ATTACH_PACKET):
                await _deliver(packet, stdout, stderr)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            sock.close()
        for sink in (stdout, stderr):
            if sink is not None:
                await sink.close()

    async def _attach_shared(self, rec: Any, path: str, tty: bool, stdout: ByteSink | None,
                             stderr: ByteSink | None,
                             resize: AsyncIterator[TerminalSize] | None) -> None:
        resizes = (asyncio.create_task(self._attach_resizes(rec.bundle, resize))
                   if resize is not None and tty else None)
        try:
            async with self.attach_hub.session(
                    rec.id, lambda: _connect_attach(rec.id, path)) as packets:
                while (packet := await packets.get()) is not None:
                    await _deliver(packet, stdout, stderr)
        finally:
            if resizes is not None:
                resizes.cancel()
                await asyncio.gather(resizes, return_exceptions=True)
        for sink in (stdout, stderr):
            if sink is not None:
                await sink.close()

    async def _attach_stdin(self, sock: socket.socket, src: ByteSource) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            while data := await src.read(8192):
                await loop.sock_sendall(sock, data)
            # Half-close: conmon closes the container's stdin unless told to keep it open.
            sock.shutdown(socket.SHUT_WR)

    async def _attach_resizes(self, bundle: str, sizes: AsyncIterator[TerminalSize]) -> None:
        async for size in sizes:
            if size.width > 0 and size.height > 0:
                self.resizes.resize(bundle, size)

    # -- port forward

    async def port_forward(self, pod_id: str,
                           port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sb = self.sandboxes.get(pod_id)
        if not sb.netns_path:
            # Host-network pod: its 127.0.0.1 is the host's.
            return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port),
                                          DIAL_TIMEOUT)

        def dial() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                s.settimeout(DIAL_TIMEOUT)
                s.connect(("127.0.0.1", port))
                s.setblocking(False)
            except OSError:
                s.close()
                raise
            return s

        sock = await in_netns(sb.netns_path, dial)
        opened: Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = \
            asyncio.open_connection(sock=sock)
        return await opened
