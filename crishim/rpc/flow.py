"""A connection's flow control: request bytes held and the window offered again
(within its share and the server's budget), control-frame replies counted, streams
reset and released, and frames out.

The state is the connection's own (set in Connection.__init__); this part only reads
and moves it."""

from __future__ import annotations

import asyncio

from crishim.rpc import frames as fr
from crishim.rpc import grpcwire
from crishim.rpc.limits import FAIR_SHARE, Budget, Limits
from crishim.rpc.stream import ProtocolError, Stream

# Control-frame replies (SETTINGS and PING ACKs, RST_STREAMs) a peer may leave unread
# before the connection ends with ENHANCE_YOUR_CALM (Go's server allows 10,000).
MAX_CONTROL_FRAMES = 10_000


class FlowControl:
    _transport: asyncio.Transport | None
    _limits: Limits
    _budget: Budget
    _max_message: int
    _control: int
    _recv_window: int
    _unacked: int
    _held: int
    _send_window: int
    _out: list[bytes | bytearray | memoryview]
    _streams: dict[int, Stream]
    _window_waiters: list[asyncio.Future[None]]
    closed: bool

    def reopen(self) -> None:
        """The budget has room again: offer the window this connection held back."""
        if not self.closed:
            self._credit()
            self._flush()

    def _reset(self, st: Stream, code: int) -> None:
        """A stream error (or the peer's reset): RST_STREAM unless the stream is closed
        already, and its call, if running, is cancelled."""
        self._streams.pop(st.id, None)
        if not st.closed:
            st.closed = True
            self._send(fr.rst_stream(st.id, code))
            self._control_reply()
        if st.task is not None:
            st.task.cancel()  # its end releases what the stream holds
        else:
            self._release(st)
        self._wake_senders()

    # --- request flow control -------------------------------------------------------------
    def _release(self, st: Stream) -> None:
        """The stream's request bytes are no longer held: the window may open again."""
        n = st.held
        if n:
            st.held = 0
            self._held -= n
            self._budget.release(n)
            if self._unacked >= self._limits.connection_window >> 1:
                self._credit()

    def _credit(self) -> None:
        """Offer the peer again what it sent, while this connection holds less than its
        share or less than one message while the budget has room; otherwise wait for
        the budget (Budget.release)."""
        n = self._unacked
        if not n or self.closed:
            return
        if self._held >= FAIR_SHARE and (
                self._held >= self._max_message + grpcwire.PREFIX_LEN
                or self._budget.held >= self._budget.limit):
            self._budget.waiting[self] = None
            return
        self._unacked = 0
        self._recv_window += n
        self._send(fr.window_update(0, n))

    def _control_reply(self) -> None:
        """Count a control-frame reply; too many that the peer leaves unread end the
        connection."""
        self._control += 1
        if self._control > MAX_CONTROL_FRAMES:
            self._flush()
            transport = self._transport
            if transport is not None and transport.get_write_buffer_size():
                raise ProtocolError(fr.ENHANCE_YOUR_CALM, f"more than {MAX_CONTROL_FRAMES} "
                                    "control frames queued unread")
            self._control = 0

    # --- frames out -----------------------------------------------------------------------
    def _send(self, data: bytes | bytearray | memoryview) -> None:
        self._out.append(data)

    def _flush(self) -> None:
        if not self._out:
            return
        out, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def _wake_senders(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
