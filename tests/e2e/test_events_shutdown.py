"""An open GetContainerEvents stream ends cleanly when the daemon is stopped.

The kubelet keeps an event stream open all the time; without this the daemon's SIGTERM
drain would wait the full drain_timeout for a stream that never finishes by itself.
"""

from __future__ import annotations

import threading
import time

import grpc

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e.daemon import running_daemon


def test_sigterm_ends_event_stream_with_ok() -> None:
    # A drain far longer than the test's thread join: the stream must end on its own.
    with running_daemon("drain_timeout = 120.0\n") as d:
        ready = threading.Event()
        outcome: list[object] = []
        stream = d.runtime().GetContainerEvents(pb.GetEventsRequest())

        def consume() -> None:
            try:
                ready.set()
                for _ in stream:
                    pass
                outcome.append("ended")
            except grpc.RpcError as exc:
                outcome.append(exc.code())

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        ready.wait(5)
        time.sleep(0.5)  # let the server register the call before SIGTERM
        assert d.stop() == 0
        t.join(30)
        assert not t.is_alive(), "the event stream did not end within 30s of SIGTERM"
        assert outcome == ["ended"]
        assert "shutting down" in d.logs()
