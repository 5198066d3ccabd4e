"""The pause of each READY pod, watched through a pidfd on the event loop (runtime/pidwatch.py):
its death makes the pod NOTREADY at once. StopPodSandbox takes the pidfd over to kill
that very process.

The pause is not crishim's child (runc's, reparented to init or the nearest subreaper),
so there is no exit code; nobody needs one.
"""

from __future__ import annotations

import os

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.log import get_logger
from crishim.runtime import pidwatch
from crishim.runtime.kill import kill_and_delete
from crishim.runtime.runc import RuntimeRegistry
from crishim.sandbox.events import SandboxEvents
from crishim.sandbox.registry import SandboxRegistry
from crishim.store.db import Database
from crishim.store.sandbox import KIND, NOTREADY, READY, Sandbox

log = get_logger(__name__)


class PauseWatch:
    def __init__(self, db: Database, pods: SandboxRegistry, runtimes: RuntimeRegistry,
                 events: SandboxEvents) -> None:
        self.db = db
        self.pods = pods
        self.runtimes = runtimes
        self.events = events
        self.pids = pidwatch.PidWatcher()

    def watch(self, sb: Sandbox) -> bool:
        """Watch the pause's pid: its death makes the sandbox NOTREADY. False when it is
        gone already."""
        return self.pids.watch(sb.id, sb.pid, self.on_exit)

    def take(self, sid: str) -> int | None:
        """The pause's pidfd, no longer watched (a kill the caller is about to do makes no
        NOTREADY callback); None when it is not watched. Hand it back with `give_back`."""
        return self.pids.take(sid)

    def give_back(self, sb: Sandbox, pidfd: int | None) -> None:
        """After a stop: a pod still READY (the stop failed or was cancelled) is watched
        again until a retried Stop (a pause that died meanwhile is reported at once);
        otherwise the pidfd is closed."""
        if pidfd is None:
            return
        if sb.state == READY:
            self.pids.watch(sb.id, sb.pid, self.on_exit, pidfd=pidfd)
        else:
            os.close(pidfd)

    async def kill(self, sb: Sandbox, pidfd: int | None = None) -> None:
        """Kill and delete the pause; idempotent. `pidfd`: the pause's pidfd if the caller
        holds one (it keeps it); otherwise the pid comes from runc state.

        catatonit has nothing to shut down gracefully: SIGKILL at once, wait (bounded) for
        the pidfd to say it died, then a delete that finds it stopped."""
        await kill_and_delete(self.runtimes.get(sb.runtime_handler), sb.id, pidfd)

    async def on_exit(self, sid: str) -> None:
        """The pause died (its pidfd said so; not our child, so no exit code)."""
        sb = self.pods.exact(sid)
        if sb is None or sb.state != READY:
            return
        log.warning("pause exited; sandbox is NOTREADY", id=sid, pid=sb.pid)
        sb.state = NOTREADY
        await self.db.put(KIND, sid, sb.to_dict())
        self.events.publish(sb, pb.CONTAINER_STOPPED_EVENT)

    def close(self) -> None:
        """Forget every watch (daemon shutdown: the pods keep running)."""
        self.pids.close()
