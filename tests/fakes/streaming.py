"""The streaming server's backend faked: commands run as local processes, port-forwards dial
127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from crishim.streaming import ptyio
from crishim.streaming.interface import ByteSink, ByteSource, TerminalSize


class FakeBackend:
    """Runs the command as a local process; port-forward dials 127.0.0.1:port."""

    def __init__(self) -> None:
        self.started: list[list[str]] = []
        self.killed = 0
        self.dials = 0

    async def exec(self, container_id: str, cmd: list[str], tty: bool,
                   stdin: ByteSource | None, stdout: ByteSink | None,
                   stderr: ByteSink | None,
                   resize: AsyncIterator[TerminalSize] | None) -> int:
        self.started.append(cmd)
        tasks: list[asyncio.Task[None]] = []
        if tty:
            master, slave = os.openpty()
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
            os.close(slave)
            ptyio.set_nonblocking(master)
            tasks.append(asyncio.create_task(ptyio.pump_out(master, stdout)))
            if stdin is not None:
                tasks.append(asyncio.create_task(ptyio.pump_in(stdin, master, True)))
            if resize is not None:
                tasks.append(asyncio.create_task(ptyio.apply_resizes(master, resize)))
        else:
            master = -1
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            assert proc.stdout and proc.stderr
            tasks.append(asyncio.create_task(_pump(proc.stdout, stdout)))
            tasks.append(asyncio.create_task(_pump(proc.stderr, stderr)))
            if stdin is not None:
                assert proc.stdin
                tasks.append(asyncio.create_task(_feed(stdin, proc.stdin)))
        try:
            code = await proc.wait()
            # Output still in flight is delivered before the exit status.
            await asyncio.wait(tasks[:2] if not tty else tasks[:1], timeout=5)
            return code
        finally:
            if proc.returncode is None:
                self.killed += 1
                proc.kill()
                await proc.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if master >= 0:
                os.close(master)

    async def attach(self, container_id: str, tty: bool, stdin: ByteSource | None,
                     stdout: ByteSink | None, stderr: ByteSink | None,
                     resize: AsyncIterator[TerminalSize] | None) -> None:
        assert stdout is not None
        await stdout.write(f"attached to {container_id}\n".encode())

    async def port_forward(self, pod_id: str,
                           port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.dials += 1
        return await asyncio.open_connection("127.0.0.1", port)


async def _pump(reader: asyncio.StreamReader, sink: ByteSink | None) -> None:
    while data := await reader.read(65536):
        if sink is not None:
            await sink.write(data)
    if sink is not None:
        await sink.close()


async def _feed(src: ByteSource, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await src.read():
            writer.write(data)
            await writer.drain()
    writer.close()
