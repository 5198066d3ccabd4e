"""One connected NRI plugin: its trunk, the two ttRPC ends on it, registration,
Configure and the per-event calls.

A plugin is either external (it connected to the NRI socket and names itself in
RegisterPlugin) or pre-installed (crishim started it from `plugin_path` with one end of
a socketpair as fd 3, and its name and index come from the file name). Whatever goes
wrong with a plugin (it closes, hangs past the request timeout, breaks the framing) closes
it: the adaptation drops closed plugins, and no CRI call waits on it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message

from crishim.api.nri.v1alpha1 import api_pb2 as nri
from crishim.log import get_logger
from crishim.nri import mux as muxmod
from crishim.nri import ttrpc
from crishim.observe import metrics, tracing

log = get_logger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

# Every event a plugin may subscribe to: bit (event - 1) for each event below LAST.
VALID_EVENTS = (1 << (nri.LAST - 1)) - 1

_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
_IDX_RE = re.compile(r"^[0-9]{2}$")

M = TypeVar("M", bound=Message)


def event_bit(event: int) -> int:
    return 1 << (event - 1)


def check_name(name: str) -> str | None:
    """Why `name` is not a valid plugin name, or None."""
    if not name:
        return "plugin name is empty"
    if not _NAME_RE.match(name):
        return f"plugin name {name!r} has characters other than letters, digits, -_.+"
    return None


def check_index(idx: str) -> str | None:
    if not _IDX_RE.match(idx):
        return f"plugin index {idx!r} is not two digits"
    return None


class PluginError(Exception):
    """A plugin refused a request (its error reply), naming the plugin."""

    def __init__(self, plugin: str, method: str, message: str,
                 code: int = ttrpc.UNKNOWN) -> None:
        super().__init__(f"NRI plugin {plugin} failed {method}: {message}")
        self.plugin = plugin
        self.method = method
        # The ttRPC status: RESOURCE_EXHAUSTED (a request too big to send) is what makes
        # Synchronize split its pods and containers over several requests.
        self.code = code


# Post-events a plugin built against an older NRI may only take as StateChange.
_STATE_CHANGE_FALLBACK = {
    "RunPodSandbox": nri.RUN_POD_SANDBOX,
    "PostUpdatePodSandbox": nri.POST_UPDATE_POD_SANDBOX,
    "StopPodSandbox": nri.STOP_POD_SANDBOX,
    "RemovePodSandbox": nri.REMOVE_POD_SANDBOX,
    "PostCreateContainer": nri.POST_CREATE_CONTAINER,
    "StartContainer": nri.START_CONTAINER,
    "PostStartContainer": nri.POST_START_CONTAINER,
    "PostUpdateContainer": nri.POST_UPDATE_CONTAINER,
    "RemoveContainer": nri.REMOVE_CONTAINER,
}


@dataclass(frozen=True)
class Turn:
    """A place in a plugin's call order: the call waits for `prev` (the call before it)
    and marks `done` when it is over."""

    prev: asyncio.Future[None] | None
    done: asyncio.Future[None]


class Plugin:
    """The runtime's end of one plugin connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 updates: Callable[[Plugin, nri.UpdateContainersRequest],
                                   Coroutine[Any, Any, list[nri.ContainerUpdate]]],
                 idx: str = "", base: str = "", config: str = "", pid: int = 0,
                 launched: bool = False) -> None:
        """`updates`: carries out a plugin's unsolicited UpdateContainers (updates and
        evictions), returns the updates that failed."""
        self.idx = idx
        self.base = base
        self.config = config
        self.pid = pid
        self.launched = launched
        self.events = 0
        self._updates = updates
        self._registered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed = asyncio.Event()
        # The last call's Turn: a plugin gets one call at a time, in the order the
        # events happened (the reference holds one lock for every event).
        self._tail: asyncio.Future[None] | None = None
        self.close_reason = ""
        self._mux = muxmod.Mux(reader, writer, on_close=self._trunk_closed)
        pconn = self._mux.open(muxmod.PLUGIN_SERVICE_CONN)
        rconn = self._mux.open(muxmod.RUNTIME_SERVICE_CONN)
        self._client = ttrpc.Client(pconn, pconn.write)
        self._server = ttrpc.Server({RUNTIME_SERVICE: {
            "RegisterPlugin": ttrpc.Method(nri.RegisterPluginRequest, self._register),
            "UpdateContainers": ttrpc.Method(nri.UpdateContainersRequest,
                                             self._update_containers),
        }})
        self._tasks = [
            asyncio.create_task(self._mux.run(), name="nri-mux"),
            asyncio.create_task(self._client.run(), name="nri-client"),
            asyncio.create_task(self._serve(rconn), name="nri-server"),
        ]

    @property
    def name(self) -> str:
        return f"{self.idx or '??'}-{self.base or 'plugin'}"

    @property
    def kind(self) -> str:
        return "pre-connected" if self.launched else "external"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def subscribed(self, event: int) -> bool:
        return bool(self.events & event_bit(event))

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # -- the runtime's service --------------------------------------------------------------
    async def _serve(self, conn: muxmod.Conn) -> None:
        try:
            await self._server.serve(conn, conn.write)
        except ttrpc.ProtocolError as exc:
            self.close(f"protocol error: {exc}")
            return
        self.close("connection closed")

    async def _register(self, msg: Message) -> Message:
        assert isinstance(msg, nri.RegisterPluginRequest)
        if not self.launched:
            why = check_name(msg.plugin_name) or check_index(msg.plugin_idx)
            if why is not None:
                if not self._registered.done():
                    self._registered.set_exception(ttrpc.TTRPCError(ttrpc.INVALID_ARGUMENT,
                                                                    why))
                raise ttrpc.TTRPCError(ttrpc.INVALID_ARGUMENT, why)
            self.idx, self.base = msg.plugin_idx, msg.plugin_name
        log.info("NRI plugin registered", plugin=self.name, kind=self.kind, pid=self.pid,
                 nri_version=msg.NRI_version or "unknown")
        if not self._registered.done():
            self._registered.set_result(None)
        return nri.Empty()

    async def _update_containers(self, msg: Message) -> Message:
        assert isinstance(msg, nri.UpdateContainersRequest)
        log.info("NRI plugin requested container updates", plugin=self.name,
                 updates=len(msg.update), evictions=len(msg.evict))
        failed = await self._updates(self, msg)
        return nri.UpdateContainersResponse(failed=failed)

    # -- start-up ---------------------------------------------------------------------------
    async def start(self, runtime_name: str, runtime_version: str, nri_version: str,
                    config_for: Callable[[str, str], Awaitable[str]],
                    registration_timeout: float, request_timeout: float) -> None:
        """Wait for RegisterPlugin, then Configure; raises (and closes the plugin) when
        either fails or times out. `config_for(idx, base)`: an external plugin's config."""
        try:
            closed = asyncio.create_task(self._closed.wait())
            try:
                waiters: set[asyncio.Future[Any]] = {self._registered, closed}
                done, _ = await asyncio.wait(waiters,
                                             timeout=registration_timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                closed.cancel()
            if self._registered in done:
                self._registered.result()
            elif self.closed:
                raise ttrpc.ConnectionClosed(
                    f"connection closed before registration ({self.close_reason})")
            else:
                raise ttrpc.TTRPCError(ttrpc.DEADLINE_EXCEEDED,
                                       f"no registration within {registration_timeout:g}s")
            if not self.launched:
                self.config = await config_for(self.idx, self.base)
            req = nri.ConfigureRequest(
                config=self.config, runtime_name=runtime_name,
                runtime_version=runtime_version,
                registration_timeout=int(registration_timeout * 1000),
                request_timeout=int(request_timeout * 1000), NRI_version=nri_version)
            rpl = await self._client.call(PLUGIN_SERVICE, "Configure", req,
                                          nri.ConfigureResponse, request_timeout)
            events = rpl.events
            if events & ~VALID_EVENTS:
                raise ttrpc.TTRPCError(ttrpc.INVALID_ARGUMENT,
                                       f"invalid plugin events: {events & ~VALID_EVENTS:#x}")
            self.events = events or VALID_EVENTS
        except BaseException as exc:
            self.close(f"start failed: {exc}")
            raise

    # -- calls ------------------------------------------------------------------------------
    def turn(self) -> Turn:
        """The next place in this plugin's call order, taken now."""
        prev, self._tail = self._tail, asyncio.get_running_loop().create_future()
        return Turn(prev, self._tail)

    async def call(self, method: str, request: Message, reply: type[M], limit: float,
                   turn: Turn | None = None) -> M:
        """Call the plugin once the calls before it (or before `turn`) are over; a dead,
        hung or garbled plugin is closed and ConnectionClosed raised (callers skip it);
        its error reply is PluginError."""
        turn = turn or self.turn()
        try:
            if turn.prev is not None and not turn.prev.done():
                await asyncio.wait({turn.prev})
            with tracing.span(f"nri {method} {self.name}", **{"nri.plugin": self.name,
                                                               "nri.method": method}), \
                    metrics.timed(metrics.NRI_PLUGIN_DURATION, self.name, method):
                return await self._call(method, request, reply, limit)
        finally:
            if not turn.done.done():
                turn.done.set_result(None)

    async def _call(self, method: str, request: Message, reply: type[M], limit: float) -> M:
        if self.closed:
            raise ttrpc.ConnectionClosed(f"plugin closed: {self.close_reason}")
        t0 = time.perf_counter()
        try:
            out = await self._client.call(PLUGIN_SERVICE, method, request, reply, limit)
            log.debug("NRI call", plugin=self.name, method=method,
                      ms=round((time.perf_counter() - t0) * 1000, 2))
            return out
        except ttrpc.ConnectionClosed as exc:
            self.close(f"{method}: {exc.message}")
            raise
        except ttrpc.TTRPCError as exc:
            if exc.code in (ttrpc.DEADLINE_EXCEEDED, ttrpc.INTERNAL):
                log.error("closing NRI plugin", plugin=self.name, method=method,
                          error=exc.message)
                self.close(f"{method}: {exc.message}")
                raise ttrpc.ConnectionClosed(exc.message) from None
            if exc.code == ttrpc.UNIMPLEMENTED and method in _STATE_CHANGE_FALLBACK:
                return await self._state_change(method, request, reply, limit)
            raise PluginError(self.name, method, exc.message, exc.code) from None

    async def _state_change(self, method: str, request: Message, reply: type[M],
                            limit: float) -> M:
        ev = nri.StateChangeEvent(event=_STATE_CHANGE_FALLBACK[method])
        pod = getattr(request, "pod", None)
        ctr = getattr(request, "container", None)
        if isinstance(pod, nri.PodSandbox):
            ev.pod.CopyFrom(pod)
        if isinstance(ctr, nri.Container):
            ev.container.CopyFrom(ctr)
        try:
            await self._client.call(PLUGIN_SERVICE, "StateChange", ev, nri.Empty, limit)
        except ttrpc.TTRPCError as exc:
            if exc.code in (ttrpc.DEADLINE_EXCEEDED, ttrpc.INTERNAL, ttrpc.UNAVAILABLE):
                self.close(f"StateChange: {exc.message}")
                raise ttrpc.ConnectionClosed(exc.message) from None
            raise PluginError(self.name, "StateChange", exc.message) from None
        return reply()

    # -- teardown ---------------------------------------------------------------------------
    def _trunk_closed(self, err: BaseException | None) -> None:
        self._client.close(err)
        self.close(f"connection lost: {err}" if err else "connection closed")

    def close(self, reason: str) -> None:
        if self._closed.is_set():
            return
        self.close_reason = reason
        self._closed.set()
        log.info("NRI plugin closed", plugin=self.name, reason=reason)
        self._mux.close()
        self._client.close()
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                t.cancel()

    async def shutdown(self) -> None:
        """Close and wait for the tasks."""
        self.close("runtime shutting down")
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
