"""Async client for the runc CLI (crun is CLI-compatible for everything used here).

`OCIRuntime` builds every runtime command line crishim runs: its own calls, `exec`
(crishim.runtime.execproc runs it), the runtime flags handed to conmon, and `features`; a new
per-handler option goes into `base_args` and `monitor_args` here.

Every call runs `<binary> --root <root> --log <file> --log-format json ...`: runc writes
the real reason of a failure to that log as JSON lines, and `OCIRuntimeError` surfaces the
last "error" message from it (stderr is the fallback).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crishim.config import Config
from crishim.errors import FailedPrecondition, Internal, InvalidArgument
from crishim.log import get_logger
from crishim.observe import metrics, tracing
from crishim.oci import annotations as ann
from crishim.proc import spawn
from crishim.runtime.fdwait import wait_readable

if TYPE_CHECKING:  # host.facts imports the oci package
    from crishim.host.facts import HostFacts

log = get_logger(__name__)

# How long an in-process start waits for runc init before handing over to `runc start`.
FIFO_START_TIMEOUT = 5.0
# How long `create` (no monitor) may take.
CREATE_TIMEOUT = 60.0
# How long `features` (and `--version`, at start) may take.
FEATURES_TIMEOUT = 5.0

# Substrings of runc/crun errors that mean "this container does not exist (any more)".
_NOT_EXIST = ("does not exist", "not exist", "no such file", "not found")
# ... and "the process is already gone", for kill.
# `kill --all` freezes the cgroup first, which fails this way when the container has
# just stopped.
_NOT_RUNNING = ("not running", "process already finished", "no such process",
                "container not running", "cannot kill a stopped", "is stopped",
                "invalid state transition from stopped")


# ... and "the container's command cannot be executed" (missing, not executable, wrong
# format): the image or the request is at fault, not the runtime (runc, crun wording).
_EXEC_FAILED = ("unable to start container process: exec:", "executable file not found",
                "not found in $path", "exec format error")


# ... and "this runtime cannot run containers on this host at all" (crun on a cgroup v1
# host with cgroup2 mounted beside it): the handler, not the request, is at fault.
_HOST_REFUSED = ("cgroups in hybrid mode not supported",)


class OCIRuntimeError(Internal):
    """An OCI runtime command failed; the message carries the runtime's own reason.

    INTERNAL, except when the container's own command cannot be executed, or the
    runtime cannot run on this host: FAILED_PRECONDITION, since fixing the image, the
    command or the choice of handler is up to the user."""

    def __init__(self, message: str, *, rc: int = -1, stderr: str = "") -> None:
        super().__init__(message)
        self.rc = rc
        self.stderr = stderr
        text = (message + " " + stderr).lower()
        if any(s in text for s in _EXEC_FAILED + _HOST_REFUSED):
            self.code = FailedPrecondition.code

    def not_exist(self) -> bool:
        text = (str(self) + " " + self.stderr).lower()
        return any(s in text for s in _NOT_EXIST)

    def not_running(self) -> bool:
        text = (str(self) + " " + self.stderr).lower()
        return any(s in text for s in _NOT_RUNNING)


def last_log_error(text: str) -> str:
    """The last error message in a runc/crun JSON log; else its last plain line (a
    runtime that logged no JSON error, or a panic)."""
    error = plain = ""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            plain = line
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal", "panic"):
            error = str(entry.get("msg", ""))
    return error or plain


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def read_small(path: str) -> str:
    """Read a small file on tmpfs (a runc log); '' when missing."""
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


class OCIRuntime:
    """One configured OCI runtime: its name (handler), binary and state root."""

    def __init__(self, name: str, binary: str, root: str, systemd_cgroup: bool = False) -> None:
        self.name = name
        self.binary = shutil.which(binary) or binary
        self.root = root
        self.systemd_cgroup = systemd_cgroup
        # runc's start protocol (the exec fifo in its state dir) is done in-process.
        self._fifo_start = os.path.basename(self.binary) == "runc"

    def __repr__(self) -> str:
        return f"OCIRuntime({self.name!r}, {self.binary!r}, root={self.root!r})"

    def base_args(self) -> list[str]:
        """The binary and global flags every invocation starts with."""
        args = [self.binary, "--root", self.root]
        if self.systemd_cgroup:
            args.append("--systemd-cgroup")
        return args

    def monitor_args(self, log_path: str) -> list[str]:
        """conmon's flags that make it run this runtime with the global flags of
        `base_args` (conmon's --systemd-cgroup passes that flag on to the runtime).

        The runtime logs to `log_path`: conmon hands it the container's stdio, so a
        warning it printed (e.g. runc's "skipping device ... for systemd") would otherwise
        land in the container's log as if the container had said it."""
        args = ["--runtime", self.binary, f"--runtime-arg=--root={self.root}",
                f"--runtime-arg=--log={log_path}", "--runtime-arg=--log-format=json"]
        if self.systemd_cgroup:
            args.append("--systemd-cgroup")
        return args

    def exec_args(self, cid: str, process_file: str, pid_file: str) -> list[str]:
        """`exec` of the process spec in `process_file`, in the foreground: the runtime
        stays the exec'd process's parent and exits with its status (128+n for a signal)."""
        return [*self.base_args(), "exec", "--process", process_file, "--pid-file", pid_file,
                cid]

    async def _ask(self, *args: str) -> tuple[bytes, str]:
        """(stdout, "") of a quick `<binary> args...`, or (stdout, why it failed)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self.binary, *args, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            return b"", exc.strerror or str(exc)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), FEATURES_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return b"", f"no answer within {FEATURES_TIMEOUT:g}s"
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip().splitlines()
            return out, f"exit {proc.returncode}" + (f": {text[-1]}" if text else "")
        return out, ""

    async def features(self) -> bytes:
        """What `<runtime> features` prints (runc >= 1.1); b"" when the binary is missing,
        has no such command (crun 1.8) or does not answer in time."""
        if shutil.which(self.binary) is None:
            return b""
        out, error = await self._ask("features")
        if error.startswith("exit"):
            return b""
        if error:
            log.warning("cannot ask the runtime for its features", runtime=self.binary,
                        error=error)
        return b"" if error else out

    async def version(self) -> tuple[str, str]:
        """(first line of `<runtime> --version`, "") or ("", why the binary cannot run)."""
        out, error = await self._ask("--version")
        lines = out.decode(errors="replace").strip().splitlines()
        return ("", error) if error else (lines[0] if lines else "", "")

    async def run(self, *args: str, input: bytes | None = None,
                  timeout: float | None = None,  # noqa: ASYNC109 - part of the shared API
                  check: bool = True, null_stdio: bool = False) -> tuple[int, bytes, bytes]:
        """Run `<runtime> --root R --log-format json args...` → (rc, out, err).

        With check=True a non-zero exit raises OCIRuntimeError with the runtime's reason,
        from its JSON log on stderr. With null_stdio the runtime's stdin/stdout/stderr are
        /dev/null (out and err are empty) and only its exit is awaited: for a command
        whose child keeps the stdio; its log then goes to a file (`--log`).
        """
        command = args[0] if args else ""
        with tracing.span(f"{self.name} {command}", **{
                "oci.runtime": self.name, "oci.container_id": args[-1] if args else ""}), \
                metrics.timed(metrics.OCI_RUNTIME_DURATION, self.name, command):
            return await self._run(args, input, timeout, check, null_stdio)

    async def _run(self, args: tuple[str, ...], input: bytes | None,
                   timeout: float | None,  # noqa: ASYNC109 - as run's
                   check: bool, null_stdio: bool) -> tuple[int, bytes, bytes]:
        # A file per call only where stderr cannot carry the log: creating and removing
        # one in the runtime's root, beside its own state, can hold the event loop for
        # tens of milliseconds while pods start.
        log_path = await asyncio.to_thread(self._new_log_file) if null_stdio else None
        try:
            cmd = [*self.base_args(), *(["--log", log_path] if log_path else []),
                   "--log-format", "json", *args]
            piped = spawn.DEVNULL if null_stdio else spawn.PIPE
            proc = await spawn.start(
                cmd, stdin=spawn.PIPE if input is not None else spawn.DEVNULL,
                stdout=piped, stderr=piped, start_new_session=True)
            try:
                if null_stdio:
                    await asyncio.wait_for(proc.wait(), timeout)
                    out, err = b"", b""
                else:
                    out, err = await asyncio.wait_for(proc.communicate(input), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise OCIRuntimeError(f"{self.name} {args[0] if args else ''} timed out after "
                                      f"{timeout}s") from None
            rc = proc.returncode if proc.returncode is not None else -1
            if rc != 0 and check:
                stderr = err.decode(errors="replace").strip()
                log_text = await asyncio.to_thread(read_small, log_path) if log_path else stderr
                raise OCIRuntimeError(
                    f"{self.name} {' '.join(args[:1])} failed (exit {rc}): "
                    f"{last_log_error(log_text) or 'no error message'}", rc=rc, stderr=stderr)
            return rc, out, err
        finally:
            if log_path:
                # Shielded: a cancelled call still removes its file.
                await asyncio.shield(asyncio.to_thread(_unlink_quietly, log_path))

    def _new_log_file(self) -> str:
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=".log-", dir=self.root)
        os.close(fd)
        return path

    async def state(self, cid: str) -> dict[str, Any] | None:
        """`runc state`; None when the container does not exist."""
        try:
            _, out, _ = await self.run("state", cid)
        except OCIRuntimeError as exc:
            if exc.not_exist():
                return None
            raise
        result: dict[str, Any] = json.loads(out)
        return result

    async def create(self, cid: str, bundle: str, pid_file: str,
                     timeout: float = CREATE_TIMEOUT,  # noqa: ASYNC109 - a plain bound
                     ) -> int:
        """`<runtime> create --bundle B --pid-file P <id>` with no monitor; returns the
        container's pid (from the pid file). The container is then "created": call
        `start(id)` to run it.

        stdin, stdout and stderr are /dev/null: without a terminal the runtime hands its
        own stdio to the container process, which keeps it for its whole life, so a pipe
        here would never reach EOF (and would break once we closed our end). The reason of
        a failure comes from the runtime's --log file instead."""
        await self.run("create", "--bundle", bundle, "--pid-file", pid_file, cid,
                       timeout=timeout, null_stdio=True)
        pid = read_pid_file(pid_file)
        if pid <= 0:
            raise OCIRuntimeError(f"{self.name} create {cid} succeeded but wrote no pid to "
                                  f"{pid_file}")
        return pid

    async def start(self, cid: str) -> None:
        """Start a created container.

        For runc this is what `runc start` itself does, minus spawning runc: read the
        container's exec fifo (runc init blocks writing to it until someone reads, then
        execs the process) and remove it. Anything unexpected falls back to the CLI, which
        then reports the real error."""
        if self._fifo_start:
            with tracing.span(f"{self.name} start", **{"oci.runtime": self.name,
                                                       "oci.container_id": cid}), \
                    metrics.timed(metrics.OCI_RUNTIME_DURATION, self.name, "start"):
                if await self._start_via_fifo(cid):
                    return
        await self.run("start", cid)

    async def _start_via_fifo(self, cid: str) -> bool:
        fifo = os.path.join(self.root, cid, "exec.fifo")
        try:
            # Non-blocking: never hang on a fifo whose writer died before opening it.
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if not await wait_readable(fd, FIFO_START_TIMEOUT):
                return False
            try:
                data = os.read(fd, 16)
            except BlockingIOError:
                return False
        finally:
            os.close(fd)
        if not data:
            return False  # the init went away without writing: let runc report why
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fifo)
        return True

    async def kill(self, cid: str, sig: int = signal.SIGTERM, all_procs: bool = False) -> None:
        """Signal the container; a container that is gone or stopped is not an error."""
        args = ["kill"]
        if all_procs:
            args.append("--all")
        args += [cid, str(int(sig))]
        try:
            await self.run(*args)
        except OCIRuntimeError as exc:
            if exc.not_exist() or exc.not_running():
                return
            raise

    async def delete(self, cid: str, force: bool = False) -> None:
        """Delete the container; idempotent (a missing container is success)."""
        args = ["delete"]
        if force:
            args.append("--force")
        try:
            await self.run(*args, cid)
        except OCIRuntimeError as exc:
            if exc.not_exist():
                return
            raise

    async def pause(self, cid: str) -> None:
        """Freeze the container's processes (the cgroup freezer)."""
        await self.run("pause", cid)

    async def resume(self, cid: str) -> None:
        await self.run("resume", cid)

    async def checkpoint(self, cid: str, image_path: str, work_path: str,
                         timeout: float | None = None,  # noqa: ASYNC109 - a plain bound
                         ) -> None:
        """CRIU's images of the running container into `image_path` (its log and stats in
        `work_path`); the container keeps running. Its stdio are conmon's pipes, which
        CRIU records as external: a restore hands it new ones."""
        await self.run("checkpoint", "--image-path", image_path, "--work-path", work_path,
                       "--leave-running", cid, timeout=timeout)

    async def list(self) -> list[dict[str, Any]]:
        _, out, _ = await self.run("list", "--format", "json")
        text = out.strip()
        if not text or text == b"null":
            return []
        result: list[dict[str, Any]] = json.loads(text)
        return result

    async def update(self, cid: str, resources: Mapping[str, Any]) -> None:
        """`runc update -r -` with the OCI LinuxResources JSON on stdin."""
        await self.run("update", "--resources", "-", cid, input=json.dumps(resources).encode())



@dataclass(frozen=True)
class Readiness:
    """What the start-up probe found about one handler's runtime."""

    ready: bool = True
    reason: str = ""  # why it cannot run, for Status(verbose), the log and refusals
    version: str = ""  # the first line of `<runtime> --version`
    features: bytes | None = None  # `<runtime> features` output; None: not probed


def readiness(binary: str, found: bool, version: str, error: str,
              host: HostFacts | None) -> Readiness:
    """Whether a runtime can run containers on this host, from what the probe saw: the
    binary on PATH, its `--version` (the runtime's identity; an error means it cannot
    execute at all) and the host's cgroups.

    crun makes no container on a cgroup v1 host whose cgroup2 mount beside the v1
    hierarchies (/sys/fs/cgroup/unified) has controllers: its own rule, checked here so
    the handler is not announced rather than failing every pod."""
    if not found:
        return Readiness(False, f"{binary} is not found (install it, or set the handler's "
                         "path under [runtimes] in the config)")
    if error:
        return Readiness(False, f"{binary} cannot run: {error}")
    if version.lower().startswith("crun") and host is not None \
            and host.cgroups.version == 1 and host.hybrid_v2_controllers:
        return Readiness(False, "crun refuses a cgroup v1 hybrid host: the cgroup2 mount "
                         "/sys/fs/cgroup/unified has controllers ("
                         + ",".join(sorted(host.hybrid_v2_controllers))
                         + "); use runc, or boot with cgroup v2", version)
    return Readiness(True, "", version)


async def probe_runtime(runtime: OCIRuntime, host: HostFacts | None) -> Readiness:
    """`--version` and `features` of one runtime (once, at start) and the verdict."""
    found = await asyncio.to_thread(shutil.which, runtime.binary) is not None
    if not found:
        return readiness(runtime.binary, False, "", "", host)
    (version, error), features = await asyncio.gather(runtime.version(), runtime.features())
    verdict = readiness(runtime.binary, True, version, error, host)
    return Readiness(verdict.ready, verdict.reason, verdict.version, features)


class RuntimeRegistry:
    """RuntimeClass handler name → OCIRuntime ("" is the default runtime).

    `probe()`, once at start, finds which handlers can run on this host (`readiness`):
    the others stay resolvable (their pods from before can be stopped and removed) but
    are not announced, and `usable()` refuses them for new pods and containers."""

    def __init__(self, cfg: Config, host: HostFacts | None = None) -> None:
        """`host`: the facts the probe judges by; None (tests) judges by the binary only."""
        self.cfg = cfg
        self.host = host
        systemd = cfg.effective_cgroup_driver() == "systemd"
        self._runtimes = {name: OCIRuntime(name, h.path, cfg.runtime_root(name), systemd)
                          for name, h in cfg.runtimes.items()}
        # Until probed, every handler counts as ready (what a runtime itself refuses
        # still comes back FAILED_PRECONDITION from OCIRuntimeError).
        self._ready: dict[str, Readiness] = {}

    async def probe(self) -> None:
        """Probe every handler's runtime, concurrently; warn once for each that cannot run."""
        names = list(self._runtimes)
        found = await asyncio.gather(*(probe_runtime(self._runtimes[n], self.host)
                                       for n in names))
        self._ready = dict(zip(names, found, strict=True))
        for name, r in self._ready.items():
            if not r.ready:
                log.warning("runtime handler cannot run on this host; it is not announced "
                            "and pods for it are refused", handler=name, reason=r.reason)

    def resolve_name(self, handler: str) -> str:
        name = handler or self.cfg.default_runtime
        if name not in self._runtimes:
            known = ", ".join(sorted(self._runtimes)) or "none"
            raise InvalidArgument(f"runtime handler {handler!r} is not configured; known: "
                                  f"{known} (add it under [runtimes] in the config)")
        return name

    def get(self, handler: str) -> OCIRuntime:
        return self._runtimes[self.resolve_name(handler)]

    def readiness(self, handler: str) -> Readiness:
        return self._ready.get(self.resolve_name(handler), _UNPROBED)

    def usable(self, handler: str) -> OCIRuntime:
        """The handler's runtime for a new pod or container; FailedPrecondition naming the
        handler and why when the start-up probe found it cannot run here."""
        name = self.resolve_name(handler)
        state = self._ready.get(name, _UNPROBED)
        if not state.ready:
            raise FailedPrecondition(f"runtime handler {name!r} cannot run on this host: "
                                     f"{state.reason}")
        return self._runtimes[name]

    def all(self) -> list[OCIRuntime]:
        return list(self._runtimes.values())


_UNPROBED = Readiness()


def read_pid_file(path: str) -> int:
    """The pid in a --pid-file (runc) or -P file (conmon); 0 when absent or unreadable.
    A few bytes on tmpfs: read inline, not worth a thread hop."""
    try:
        with open(path) as fh:
            return int(fh.read().strip() or "0")
    except (OSError, ValueError):
        return 0




async def unowned_containers(runtimes: RuntimeRegistry, container_type: str,
                             owned: Container[str]) -> list[tuple[OCIRuntime, str]]:
    """(runtime, id) of the containers under our runtime roots whose CRI container-type
    annotation is `container_type` and whose id is not in `owned`: what a lost database or
    a crash left behind, for start-up reconciliation to delete."""
    found: list[tuple[OCIRuntime, str]] = []
    for runtime in runtimes.all():
        if not await asyncio.to_thread(os.path.isdir, runtime.root):
            continue
        try:
            listed = await runtime.list()
        except (OCIRuntimeError, OSError) as exc:
            log.warning("cannot list runtime containers", runtime=runtime.name, error=str(exc))
            continue
        for item in listed:
            cid = str(item.get("id", ""))
            annotations = item.get("annotations") or {}
            if annotations.get(ann.CONTAINER_TYPE) == container_type and \
                    cid not in owned:
                found.append((runtime, cid))
    return found
