"""A created container's process: conmon and `runc create`, StartContainer's first step,
and what a failed `runc start` says about a concurrent stop.

Done at StartContainer rather than CreateContainer (as containerd creates its task at
start): a created container is a prepared bundle and costs no process.
"""

from __future__ import annotations

import contextlib

from crishim.host import logfiles
from crishim.host.remove import Roots
from crishim.runtime import conmon
from crishim.runtime.runc import RuntimeRegistry
from crishim.store.container import Container


class ContainerLauncher:
    def __init__(self, runtimes: RuntimeRegistry, conmon_path: str, exit_dir: str,
                 roots: Roots) -> None:
        """`conmon_path`: the conmon binary; `exit_dir`: where conmon writes exit files;
        `roots`: the daemon's directories, which conmon's files must stay below."""
        self.runtimes = runtimes
        self.conmon_path = conmon_path
        self.exit_dir = exit_dir
        self.roots = roots

    async def launch(self, rec: Container) -> None:
        """conmon + `runc create`: the container's process exists (its pid and conmon's
        set on `rec`), waiting to be started. A failure leaves no runc container and no
        conmon behind."""
        runtime = self.runtimes.get(rec.runtime_handler)
        config = rec.config
        try:
            created = await conmon.create(conmon.MonitorRequest(
                container_id=rec.id, bundle=rec.bundle, runtime=runtime,
                log_path=rec.log_path, exit_dir=self.exit_dir, persist_dir=rec.persist_dir,
                stdin=config.stdin, stdin_once=config.stdin_once, tty=config.tty,
                conmon_path=self.conmon_path, name=rec.name, roots=self.roots,
                log_dir=logfiles.split(rec.log_path, config.log_path)[0],
                restore_path=rec.restore_from))
        except BaseException:
            with contextlib.suppress(Exception):
                await runtime.delete(rec.id, force=True)
            conmon.kill_conmon(rec.persist_dir)
            raise
        rec.pid, rec.conmon_pid = created.pid, created.conmon_pid

    async def killed_before_start(self, rec: Container, exc: Exception) -> bool:
        """After a failed `runc start`: did a concurrent stop kill the created process?
        (A process in the created state waits on runc's exec fifo; only a signal ends it.)"""
        if "has stopped" in str(exc):
            return True
        try:
            st = await self.runtimes.get(rec.runtime_handler).state(rec.id)
        except Exception:
            return False
        # "paused": a concurrent `runc kill --all` has the cgroup frozen right now.
        return st is None or st.get("status") in ("stopped", "paused")
