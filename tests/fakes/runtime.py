"""Fake OCI runtimes: scripts standing in for runc's CLI, and OCIRuntimes running them."""

from __future__ import annotations

import os
import stat
import sys
from typing import Any

import pytest

from crishim.runtime.runc import OCIRuntime

# A fake runtime's start: global options (--log <file> kept as $log, stderr without it,
# as runc; --root as $root), then $cmd.
FAKE_PROLOGUE = """#!/bin/sh
log=/dev/stderr
root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --log) log="$2"; shift 2;;
    --root) root="$2"; shift 2;;
    --log-format) shift 2;;
    *) break;;
  esac
done
cmd="$1"; shift
"""


# runc's CLI as far as the sandbox manager uses it. State: <root>/<id>/{pid,status}.
STATEFUL_RUNC = f"""#!{sys.executable}
import json, os, shutil, signal, subprocess, sys
args = sys.argv[1:]
root = log = ""
while args[0].startswith("--"):
    if args[0] == "--root":
        root = args[1]
    elif args[0] == "--log":
        log = args[1]
    args = args[2:] if args[0] in ("--root", "--log", "--log-format") else args[1:]
cmd, args = args[0], args[1:]
def fail(msg):
    with open(log, "a") as fh:
        fh.write(json.dumps({{"level": "error", "msg": msg}}) + "\\n")
    sys.exit(1)
def load(cid):
    d = os.path.join(root, cid)
    if not os.path.isdir(d):
        fail("container does not exist")
    with open(os.path.join(d, "state")) as fh:
        st = json.load(fh)
    try:
        with open(f"/proc/{{st['pid']}}/stat") as fh:
            alive = fh.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        alive = False
    if not alive:
        st["status"] = "stopped"
    return d, st
def save(d, st):
    with open(os.path.join(d, "state"), "w") as fh:
        json.dump(st, fh)
if cmd == "create":
    bundle, pid_file, cid = args[1], args[3], args[4]
    with open(os.path.join(bundle, "config.json")) as fh:
        annotations = json.load(fh).get("annotations", {{}})
    p = subprocess.Popen(["sleep", "3600"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    d = os.path.join(root, cid)
    os.makedirs(d)
    save(d, {{"id": cid, "pid": p.pid, "status": "created", "annotations": annotations}})
    with open(pid_file, "w") as fh:
        fh.write(str(p.pid))
elif cmd == "start":
    d, st = load(args[0])
    st["status"] = "running"
    save(d, st)
elif cmd == "state":
    print(json.dumps(load(args[0])[1]))
elif cmd == "kill":
    d, st = load(args[-2])
    if st["status"] == "stopped":
        fail("container not running")
    os.kill(st["pid"], int(args[-1]))
elif cmd == "delete":
    d, st = load(args[-1])
    if st["status"] != "stopped":
        if "--force" not in args:
            fail("cannot delete container that is not stopped")
        os.kill(st["pid"], signal.SIGKILL)
    shutil.rmtree(d)
elif cmd == "list":
    print(json.dumps([load(c)[1] for c in sorted(os.listdir(root))
                      if os.path.isdir(os.path.join(root, c))]))
else:
    fail("unknown command " + cmd)
"""


# `exec --process P --pid-file F <id>` like runc: runs P's args as its child, writes the
# child's pid to F, waits for it and exits with its status. It logs "<id> pid <n>" and
# "<id> reaped <status>" to <root>/exec.log. args ["--no-pid", ...] never writes a pid;
# args ["--slow-start", S, ...] take S seconds to start the rest; ["--late-pid", S, ...]
# start the rest at once but write its pid S seconds later (runc writes it only once the
# process runs); ["--hang-with-child", ...] start the rest and never write its pid;
# ["--fail-start", S] exit 1 after S seconds, having started nothing.
EXEC_RUNC = f"""#!{sys.executable}
import json, os, subprocess, sys, time
args = sys.argv[1:]
root = ""
while args[0].startswith("--"):
    if args[0] == "--root":
        root = args[1]
    args = args[2:] if args[0] in ("--root", "--log", "--log-format") else args[1:]
assert args[0] == "exec", args
process, pid_file, cid = args[2], args[4], args[5]
with open(process) as fh:
    argv = json.load(fh)["args"]
def note(line):
    with open(os.path.join(root, "exec.log"), "a") as fh:
        fh.write(f"{{cid}} {{line}}\\n")
if argv[0] == "--no-pid":
    time.sleep(60)
if argv[0] == "--slow-start":
    time.sleep(float(argv[1]))
    argv = argv[2:]
if argv[0] == "--fail-start":
    time.sleep(float(argv[1]))
    sys.exit(1)
late = hang = 0.0
if argv[0] == "--late-pid":
    late, argv = float(argv[1]), argv[2:]
if argv[0] == "--hang-with-child":
    hang, argv = 60.0, argv[1:]
child = subprocess.Popen(argv)
note(f"child {{child.pid}}")
time.sleep(late or hang)
note(f"pid {{child.pid}}")
with open(pid_file + ".tmp", "w") as fh:
    fh.write(str(child.pid))
os.rename(pid_file + ".tmp", pid_file)
status = child.wait()
note(f"reaped {{status}}")
sys.exit(128 - status if status < 0 else status)
"""


def fake_runtime(tmp: str, script: str) -> OCIRuntime:
    """An OCIRuntime whose binary is `script`, with its root under `tmp`."""
    path = os.path.join(tmp, "fake-runc")
    with open(path, "w") as fh:
        fh.write(script)
    os.chmod(path, stat.S_IRWXU)
    return OCIRuntime("fake", path, os.path.join(tmp, "root"))


@pytest.fixture
def runtime(tmp_path: Any) -> OCIRuntime:
    """runc's `exec` faked by EXEC_RUNC, its root made."""
    rt = fake_runtime(str(tmp_path), EXEC_RUNC)
    os.makedirs(rt.root)
    return rt
