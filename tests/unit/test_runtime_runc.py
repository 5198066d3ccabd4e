"""OCIRuntime against a fake runc (a shell script), RuntimeRegistry, ExitFileWatcher."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from crishim.config import Config, RuntimeHandler
from crishim.errors import InvalidArgument
from crishim.runtime.conmon import MonitorRequest, conmon_args
from crishim.runtime.exitfiles import ExitFileWatcher, read_exit
from crishim.runtime.runc import OCIRuntime, OCIRuntimeError, RuntimeRegistry
from tests.fakes.runtime import FAKE_PROLOGUE, fake_runtime

# Writes a runc-style JSON log line like the real one (to its log), then fails.
FAKE = FAKE_PROLOGUE + """case "$cmd" in
  state)
    if [ "$1" = "known" ]; then echo '{"id":"known","status":"running","pid":42}'; exit 0; fi
    echo '{"level":"error","msg":"container does not exist"}' >> "$log"; exit 1;;
  delete|kill)
    echo '{"level":"error","msg":"container does not exist"}' >> "$log"; exit 1;;
  start)
    echo '{"level":"info","msg":"starting"}' >> "$log"
    echo '{"level":"error","msg":"cannot start a container that has stopped"}' >> "$log"
    echo "noise on stderr" >&2; exit 1;;
  list) echo 'null'; exit 0;;
  features) echo '{"mountOptions":["rro"]}'; exit 0;;
  update) mkdir -p "$root"; cat > "$root/update-input"; exit 0;;
  create)
    echo '{"level":"error","msg":"create failed: no such bundle"}' >> "$log"; exit 1;;
esac
exit 3
"""


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


@pytest.fixture
def fake(tmp_path: object) -> OCIRuntime:
    return fake_runtime(str(tmp_path), FAKE)


async def test_state_of_missing_container_is_none(fake: OCIRuntime) -> None:
    assert await fake.state("nope") is None
    state = await fake.state("known")
    assert state is not None and state["pid"] == 42


async def test_delete_and_kill_of_missing_container_succeed(fake: OCIRuntime) -> None:
    await fake.delete("nope", force=True)
    await fake.kill("nope", 9)


async def test_error_carries_runtime_log_reason(fake: OCIRuntime) -> None:
    # From the JSON log on stderr, not the plain noise after it.
    with pytest.raises(OCIRuntimeError, match="cannot start a container that has stopped"):
        await fake.start("x")
    # With /dev/null for stdio (create), from the --log file, which does not pile up.
    with pytest.raises(OCIRuntimeError, match="create failed: no such bundle"):
        await fake.create("x", "/nonexistent", "/nonexistent/pid")
    assert [f for f in os.listdir(fake.root) if f.startswith(".log-")] == []


async def test_list_null_and_update_sends_json(fake: OCIRuntime) -> None:
    assert await fake.list() == []
    await fake.update("x", {"cpu": {"shares": 512}})
    assert json.loads(_read(os.path.join(fake.root, "update-input"))) == {
        "cpu": {"shares": 512}}


async def test_features_output_or_nothing(fake: OCIRuntime, tmp_path: object) -> None:
    assert json.loads(await fake.features()) == {"mountOptions": ["rro"]}
    missing = OCIRuntime("gone", os.path.join(str(tmp_path), "no-such-runc"), fake.root)
    assert await missing.features() == b""


def test_every_runtime_command_line_carries_the_global_flags() -> None:
    rt = OCIRuntime("r", "/usr/sbin/runc", "/run/r", systemd_cgroup=True)
    assert rt.base_args() == ["/usr/sbin/runc", "--root", "/run/r", "--systemd-cgroup"]
    assert rt.exec_args("c", "/p.json", "/p.pid") == [
        *rt.base_args(), "exec", "--process", "/p.json", "--pid-file", "/p.pid", "c"]
    req = MonitorRequest("c", "/b", rt, "", "/exits", "/state/conmon/c", roots=("/state",))
    args = conmon_args(req)
    assert args[args.index("--runtime") + 1] == "/usr/sbin/runc"
    assert "--runtime-arg=--root=/run/r" in args and "--systemd-cgroup" in args
    plain = OCIRuntime("r", "/usr/sbin/runc", "/run/r")
    assert "--systemd-cgroup" not in conmon_args(MonitorRequest(
        "c", "/b", plain, "", "/exits", "/state/conmon/c", roots=("/state",)))


def test_registry_maps_handlers() -> None:
    cfg = Config(root="/r", state="/s", default_runtime="runc",
                 runtimes={"runc": RuntimeHandler("runc"), "crun": RuntimeHandler("crun")})
    reg = RuntimeRegistry(cfg)
    assert reg.get("").name == "runc" and reg.get("crun").name == "crun"
    assert reg.get("crun").root == "/s/crun"
    with pytest.raises(InvalidArgument, match=r"kata.*known: crun, runc"):
        reg.get("kata")


async def test_exit_watcher_reports_existing_and_new_exits(tmp_path: object) -> None:
    exit_dir = os.path.join(str(tmp_path), "exits")
    os.makedirs(exit_dir)
    _write(os.path.join(exit_dir, "early"), "3")
    watcher = ExitFileWatcher(exit_dir)
    await watcher.start()
    got: dict[str, tuple[int, int]] = {}
    done = asyncio.Event()

    async def on_exit(cid: str, code: int, ts: int) -> None:
        got[cid] = (code, ts)
        if len(got) == 3:
            done.set()

    try:
        watcher.watch("early", on_exit)  # exited while nobody watched
        watcher.watch("late", on_exit)
        watcher.watch("moved", on_exit)
        watcher.watch("ignored", on_exit)
        watcher.unwatch("ignored")
        _write(os.path.join(exit_dir, "late"), "137")
        tmp = os.path.join(str(tmp_path), "moved.tmp")
        _write(tmp, "0")
        os.rename(tmp, os.path.join(exit_dir, "moved"))
        _write(os.path.join(exit_dir, "ignored"), "1")
        await asyncio.wait_for(done.wait(), 5)
    finally:
        await watcher.stop()
    assert got["early"][0] == 3 and got["late"][0] == 137 and got["moved"][0] == 0
    assert "ignored" not in got
    assert got["late"][1] == os.stat(os.path.join(exit_dir, "late")).st_mtime_ns
    assert read_exit(exit_dir, "absent") is None


def _fake_named_runc(tmp: str) -> OCIRuntime:
    # Named "runc" so the in-process exec-fifo start is used; its CLI `start` fails.
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    path = os.path.join(bindir, "runc")
    _write(path, FAKE)
    os.chmod(path, stat.S_IRWXU)
    return OCIRuntime("runc", path, os.path.join(tmp, "root"))


async def test_start_reads_exec_fifo_like_runc(tmp_path: object) -> None:
    rt = _fake_named_runc(str(tmp_path))
    fifo = os.path.join(rt.root, "c1", "exec.fifo")
    os.makedirs(os.path.dirname(fifo))
    os.mkfifo(fifo)

    def init() -> None:  # what runc init does: block opening for write, then write "0"
        with open(fifo, "w") as fh:
            fh.write("0")

    writer = asyncio.get_running_loop().run_in_executor(None, init)
    await rt.start("c1")
    await writer
    assert not os.path.lexists(fifo)  # noqa: ASYNC240 - consumed, as runc start does


async def test_start_falls_back_to_cli_when_init_is_gone(tmp_path: object) -> None:
    rt = _fake_named_runc(str(tmp_path))
    fifo = os.path.join(rt.root, "c2", "exec.fifo")
    os.makedirs(os.path.dirname(fifo))
    os.mkfifo(fifo)

    def dead_init() -> None:  # opens and closes without writing: the init died
        with open(fifo, "w"):
            pass

    writer = asyncio.get_running_loop().run_in_executor(None, dead_init)
    with pytest.raises(OCIRuntimeError, match="cannot start a container that has stopped"):
        await rt.start("c2")
    await writer
    # No fifo at all (not a created container): straight to the CLI as well.
    with pytest.raises(OCIRuntimeError):
        await rt.start("absent")


@pytest.mark.parametrize(("reason", "code"), [
    ('runc create failed: unable to start container process: exec: "sh": executable file '
     'not found in $PATH', "FAILED_PRECONDITION"),
    ("crun create failed: executable file `nope` not found in $PATH: No such file or "
     "directory", "FAILED_PRECONDITION"),
    ("runc create failed: unable to start container process: exec: \"/x\": exec format error",
     "FAILED_PRECONDITION"),
    ("runc create failed: cgroup: cannot set memory limit", "INTERNAL"),
])
def test_runtime_error_code(reason: str, code: str) -> None:
    # A command the image cannot run is for the user to fix; the rest is crishim's.
    assert OCIRuntimeError(reason).code.name == code


@pytest.mark.parametrize("reason", [
    "container not running", "no such process", "cannot kill a stopped container",
    # runc's `kill --all` of a container that stopped while it was being frozen
    "runc kill failed (exit 1): invalid state transition from stopped to paused",
])
def test_kill_of_a_stopped_container_is_not_an_error(reason: str) -> None:
    assert OCIRuntimeError(reason).not_running()
    assert not OCIRuntimeError("permission denied").not_running()
