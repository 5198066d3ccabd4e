"""Run the real crishim daemon for a test: temp socket, --root and --state."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from crishim.api.runtime.v1 import api_pb2_grpc


@dataclass
class Daemon:
    """A running crishim: its dirs, process, and sync gRPC stubs."""

    workdir: str
    config_file: str
    proc: subprocess.Popen[bytes] | None = None
    log_path: str = ""
    extra_args: list[str] = field(default_factory=list)

    @property
    def socket(self) -> str:
        return os.path.join(self.workdir, "crishim.sock")

    @property
    def endpoint(self) -> str:
        return "unix://" + self.socket

    @property
    def root(self) -> str:
        return os.path.join(self.workdir, "root")

    @property
    def state(self) -> str:
        return os.path.join(self.workdir, "state")

    def args(self) -> list[str]:
        return [sys.executable, "-m", "crishim", "--config", self.config_file,
                "--listen", self.endpoint, "--root", self.root, "--state", self.state,
                "--log-level", "debug", *self.extra_args]

    def start(self, timeout: float | None = None) -> None:
        # Under emulation (the v2 guest) the interpreter alone takes seconds to start.
        if timeout is None:
            timeout = float(os.environ.get("CRISHIM_E2E_START_TIMEOUT", "20"))
        self.log_path = os.path.join(self.workdir, "crishim.log")
        logf = open(self.log_path, "ab")  # the child keeps its own copy of the fd
        self.proc = subprocess.Popen(self.args(), stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"crishim exited {self.proc.returncode}:\n{self.logs()}")
            if os.path.exists(self.socket):
                try:
                    with grpc.insecure_channel(self.endpoint) as ch:
                        grpc.channel_ready_future(ch).result(timeout=1)
                    return
                except grpc.FutureTimeoutError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"crishim did not come up in {timeout}s:\n{self.logs()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def logs(self) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return fh.read()[-20000:]
        except OSError:
            return ""

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.endpoint, options=[
            ("grpc.max_receive_message_length", 16 * 1024 * 1024)])

    def runtime(self) -> api_pb2_grpc.RuntimeServiceStub:
        return api_pb2_grpc.RuntimeServiceStub(self.channel())

    def images(self) -> api_pb2_grpc.ImageServiceStub:
        return api_pb2_grpc.ImageServiceStub(self.channel())


def write_config(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


@contextmanager
def running_daemon(config: str = "", **kw: Any) -> Iterator[Daemon]:
    """Start crishim with `config` (TOML text) in a fresh temp dir; stop it afterwards."""
    workdir = tempfile.mkdtemp(prefix="crishim-e2e-")
    os.chmod(workdir, 0o755)
    cfg = os.path.join(workdir, "crishim.toml")
    write_config(cfg, config)
    d = Daemon(workdir=workdir, config_file=cfg, **kw)
    d.start()
    try:
        yield d
    finally:
        d.stop()
        remove_workdir(workdir)


def remove_workdir(workdir: str) -> None:
    """Delete a test's temp dir, unless something is still mounted below it: removing
    through a leftover bind mount could delete host files, and a leak is the test's to
    report, not ours to hide."""
    with open("/proc/self/mountinfo") as fh:
        mounted = [line.split()[4] for line in fh]
    prefix = workdir.rstrip("/") + "/"
    if any(m == workdir or m.startswith(prefix) for m in mounted):
        return
    shutil.rmtree(workdir, ignore_errors=True)
