#!/usr/bin/env python3
"""Deliberate breaks that the tests must catch: each mutant replaces one piece of crishim's
code with a wrong version in a throw-away copy of the checkout, runs the fastest test
selection that should notice, and is reported as caught (a test failed), survived (every
test passed: a hole in the suite) or stale (its code is no longer there: update the entry).

    hack/mutants.py [--worktree] [--list] [--no-baseline] [--keep] [--tests T,..] [NAME...]
    hack/test.sh mutants [-- ARGS...]         (the same, with the project's interpreter)

The copy is `git archive HEAD` (what is committed), or with --worktree the checkout's
files as they are now (tracked and untracked, not ignored); a `shared` link beside it
points at the checkout's ../shared, so selections that need critest, crictl or the
kubelets run there as in the checkout. First the selections run once unmutated (a
selection that fails there proves nothing); then each mutant runs alone. A selection in
which every test was skipped is an error, never "survived". e2e selections need root and
the host parts, like `hack/test.sh e2e`. Exits non-zero if any mutant survived, is stale or
errored, or the baseline failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutant:
    name: str
    behaviour: str  # what a user would notice broken
    path: str  # file in the checkout
    old: str  # exact text, found exactly once
    new: str
    tests: tuple[str, ...]  # pytest selection expected to fail


MUTANTS: tuple[Mutant, ...] = (
    # --- image use (RemoveImage / image GC must never delete layers under a container) ---
    Mutant("create-no-image-use", "CreateContainer does not mark its image as in use",
           "crishim/container/manager.py",
           "            self.stores.images.mark_used(image_id, cid)\n",
           "            pass\n",
           ("tests/unit/test_container_recover.py", "tests/e2e/test_image_in_use.py")),
    Mutant("restart-forgets-image-users", "restart resets every image's users to none",
           "crishim/container/recover.py",
           "        self.images.set_users(users)\n",
           "        self.images.set_users({})\n",
           ("tests/unit/test_container_recover.py", "tests/e2e/test_image_in_use.py")),
    # --- what an image may name ---
    Mutant("digest-any-characters", "a digest's hex part may hold any characters ('/' too)",
           "crishim/image/digest.py",
           "    if not _HEX.fullmatch(hexpart):\n",
           "    if False:\n",
           ("tests/unit/test_image_digest.py",)),
    Mutant("remove-outside-roots", "a removal outside the daemon's roots goes ahead",
           "crishim/host/remove.py",
           '        if real != base and real.startswith(base.rstrip("/") + "/"):\n',
           "        if True:\n",
           ("tests/unit/test_image_remove.py", "tests/unit/test_host_remove_sandbox.py")),
    # --- unpack safety ---
    Mutant("unpack-drops-xattrs", "unpacking drops every xattr of a layer",
           "crishim/image/unpack.py",
           "                os.setxattr(target, name, raw)\n",
           "                pass\n",
           ("tests/unit/test_image_unpack.py",)),
    Mutant("unpack-allows-dotdot", "a layer member with '..' is unpacked",
           "crishim/image/unpack.py",
           '    if ".." in parts:\n',
           "    if False:\n",
           ("tests/unit/test_image_unpack.py",)),
    Mutant("unpack-keeps-overlay-xattrs", "a layer may set overlay xattrs of its own",
           "crishim/image/unpack.py",
           '            if name.startswith(("trusted.overlay.", "user.overlay.")):\n',
           "            if False:\n",
           ("tests/unit/test_image_unpack.py",)),
    # --- digest checks ---
    Mutant("blob-digest-unchecked", "a layer blob whose content does not match its digest "
           "is accepted", "crishim/image/stream.py",
           "        if self._hash.hexdigest() != self._hex:\n",
           "        if False:\n",
           ("tests/unit/test_image_stream.py",)),
    Mutant("diff-id-unchecked", "an unpacked layer whose content does not match the "
           "config's diff ID is accepted", "crishim/image/layerfetch.py",
           "        if reader.digest != diff_id:\n",
           "        if False:\n",
           ("tests/unit/test_image_stream.py",)),
    Mutant("manifest-by-digest-unchecked", "a manifest pulled by digest is accepted with "
           "other content", "crishim/image/client.py",
           "            verify(body, obj, what)\n",
           "            pass\n",
           ("tests/unit/test_image_client.py",)),
    Mutant("manifest-header-digest-unchecked", "a manifest pulled by tag is accepted when "
           "the registry's Docker-Content-Digest names other content",
           "crishim/image/client.py",
           '            if header and header.startswith("sha256:") and header != digest:\n',
           "            if False:\n",
           ("tests/unit/test_image_client.py",)),
    # --- crash recovery ---
    Mutant("vanished-exits-0", "a container that vanished while crishim was down reports "
           "success", "crishim/container/recover.py",
           "rec.exit_code, rec.finished_at = EXITED, 255, time.time_ns()",
           "rec.exit_code, rec.finished_at = EXITED, 0, time.time_ns()",
           ("tests/unit/test_container_recover.py",)),
    Mutant("no-pod-start-rollback", "restart does not roll back an interrupted "
           "RunPodSandbox", "crishim/sandbox/recover.py",
           "            await self.rollback(sb)\n",
           "            pass\n",
           ("tests/unit/test_sandbox_recover.py",)),
    Mutant("exit-file-ignored", "a container that exited while crishim was down reports "
           "exit code 0, whatever its exit file says", "crishim/container/recover.py",
           "            await self.exits.on_exit(cid, *res)\n",
           "            await self.exits.on_exit(cid, 0, res[1])\n",
           ("tests/unit/test_container_manager.py",)),
    Mutant("restart-keeps-orphan-rootfs", "restart leaves the rootfs mounts and bundles of "
           "creates and removes a crash cut short", "crishim/container/recover.py",
           "        await self._unmount_orphans()\n",
           "        pass\n",
           ("tests/unit/test_container_recover.py",)),
    Mutant("dead-pause-stays-ready", "a pod whose pause died while crishim was down stays "
           "READY", "crishim/sandbox/recover.py",
           "        sb.state = NOTREADY\n",
           "        sb.state = READY\n",
           ("tests/unit/test_sandbox_recover.py", "tests/unit/test_sandbox_manager.py")),
    # --- stop / kill ---
    Mutant("stop-never-kills", "StopContainer never escalates to SIGKILL",
           "crishim/container/stop.py",
           "        if rec.state != EXITED:\n            self.exits.killing.add(rec.id)\n",
           "        if False:\n            self.exits.killing.add(rec.id)\n",
           ("tests/unit/test_container_manager.py",)),
    Mutant("stop-ignores-stop-signal", "StopContainer sends SIGKILL instead of the image's "
           "stop signal", "crishim/container/stop.py",
           "            await runtime.kill(rec.id, rec.stop_signal)\n",
           "            await runtime.kill(rec.id, signal.SIGKILL)\n",
           ("tests/unit/test_container_manager.py",)),
    Mutant("pause-not-killed", "a pod's pause (no monitor) is deleted without being "
           "killed first", "crishim/runtime/kill.py",
           '            if state.get("status") in _ALIVE:\n',
           "            if False:\n",
           ("tests/unit/test_runtime_kill.py",)),
    Mutant("ambiguous-prefix-guesses", "a short id several containers share stops or "
           "removes one of them", "crishim/store/records.py",
           "    if len(matches) > 1:\n",
           "    if False:\n",
           ("tests/unit/test_store_records.py",)),
    Mutant("image-stop-signal-ignored", "StopContainer sends SIGTERM to an image whose "
           "STOPSIGNAL is another", "crishim/container/build.py",
           "        stop_signal=stop_signal(config, img_cfg),\n",
           "        stop_signal=15,\n",
           ("tests/unit/test_container_build.py",)),
    Mutant("termination-log-owned-by-root", "a container not running as root cannot write "
           "its termination message", "crishim/container/build.py",
           "                                _host_ids(pod, user.uid, user.gid))\n",
           "                                (0, 0))\n",
           ("tests/unit/test_container_build.py",)),
    # --- streaming tokens ---
    Mutant("token-reusable", "a streaming URL works more than once",
           "crishim/streaming/tokens.py",
           "        entry = self._entries.pop(token, None)\n",
           "        entry = self._entries.get(token)\n",
           ("tests/unit/test_streaming_protocols.py", "tests/unit/test_streaming_websocket.py")),
    Mutant("token-never-expires", "a streaming URL works after its TTL",
           "crishim/streaming/tokens.py",
           "        if entry is None or entry.expires <= self._clock():\n",
           "        if entry is None:\n",
           ("tests/unit/test_streaming_protocols.py", "tests/unit/test_streaming_websocket.py")),
    # --- request validation ---
    Mutant("run-pod-unvalidated", "RunPodSandbox takes pod resources the kernel refuses "
           "and fails later, or not at all", "crishim/cri/sandbox.py",
           "        self.daemon.checks.run_pod_sandbox(request)\n",
           "        pass\n",
           ("tests/unit/test_cri_validates.py",)),
    Mutant("create-container-unvalidated", "CreateContainer takes a relative mount path or "
           "impossible resources instead of answering INVALID_ARGUMENT",
           "crishim/cri/container.py",
           "        self.daemon.checks.create_container(request)\n",
           "        pass\n",
           ("tests/unit/test_cri_validates.py",)),
    Mutant("no-new-privs-dropped", "a container asking for no_new_privs can gain privileges "
           "(setuid binaries work)", "crishim/container/spec.py",
           '        "noNewPrivileges": bool(sc.no_new_privs),\n',
           '        "noNewPrivileges": False,\n',
           ("tests/unit/test_container_spec.py",)),
    # --- resource mapping ---
    Mutant("memory-limit-dropped", "a container's memory limit is not applied",
           "crishim/oci/resources.py",
           '            mem: dict[str, Any] = {"limit": memory}\n',
           '            mem: dict[str, Any] = {"reservation": memory}\n',
           ("tests/unit/test_oci_resources.py",)),
    Mutant("update-forgets-stored-resources", "UpdateContainerResources drops what it was "
           "not sent (the kubelet sends whole resources; zero means unchanged)",
           "crishim/container/manager.py",
           "        merged = merge(rec.config.linux.resources, update)\n",
           "        merged = update\n",
           ("tests/unit/test_container_update.py",)),
    Mutant("cpu-quota-dropped", "a container's cpu quota is not applied",
           "crishim/oci/resources.py",
           '        for src, dst in (("cpu_shares", "shares"), ("cpu_quota", "quota"),\n',
           '        for src, dst in (("cpu_shares", "shares"), ("cpu_quota", "burst"),\n',
           ("tests/unit/test_oci_resources.py",)),
)


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # caught, survived, stale, error
    detail: str
    seconds: float


def copy_checkout(dest: str, worktree: bool) -> None:
    if not worktree:
        archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", "HEAD"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
        return
    names = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "-co", "--exclude-standard"],
                           check=True, capture_output=True).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        rel = raw.decode()
        src = os.path.join(ROOT, rel)
        if not os.path.lexists(src):  # deleted in the work tree
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, rel)) or dest, exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel), follow_symlinks=False)


def make_copy(worktree: bool) -> tuple[str, str]:
    """A temp dir holding the copy of the checkout and, as the checkout has it, `shared`
    beside it (a link to the real one): (temp dir, copy)."""
    top = tempfile.mkdtemp(prefix="crishim-mutants-")
    copy = os.path.join(top, "crishim")
    os.mkdir(copy)
    shared = os.path.join(os.path.dirname(ROOT), "shared")
    if os.path.isdir(shared):
        os.symlink(os.path.realpath(shared), os.path.join(top, "shared"))
    copy_checkout(copy, worktree)
    return top, copy


def test_env(copy: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CI", None)  # a skip must count as "not caught", never as a failure
    env.pop("CRISHIM_SLOW", None)
    env["PYTHONPATH"] = copy  # the copy's crishim, also in the daemons the tests start
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def pytest(copy: str, tests: tuple[str, ...], timeout: float, stop_first: bool
           ) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider",
           "-o", "faulthandler_timeout=300", *(["-x"] if stop_first else []), *tests]
    try:
        res = subprocess.run(cmd, cwd=copy, env=test_env(copy), capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:g}s"
    return res.returncode, res.stdout + res.stderr


def failed_tests(output: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", output, re.M)]


def outcome_counts(output: str) -> dict[str, int]:
    """pytest's closing line as numbers: {"passed": 3, "skipped": 1, ...}."""
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ \w+.* in [\d.]+s", ln)]
    if not lines:
        return {}
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", lines[-1])}


def skip_reasons(output: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^SKIPPED (.+)$", output, re.M)]


def apply(copy: str, m: Mutant) -> str | None:
    """Mutate the copy; the original text, or None if the entry is stale."""
    path = os.path.join(copy, m.path)
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    if text.count(m.old) != 1:
        return None
    with open(path, "w") as fh:
        fh.write(text.replace(m.old, m.new))
    return text


def run_mutant(copy: str, m: Mutant, timeout: float) -> Outcome:
    t0 = time.monotonic()
    original = apply(copy, m)
    if original is None:
        return Outcome(m, "stale", f"{m.old.strip()!r} not found exactly once in {m.path}", 0)
    try:
        rc, out = pytest(copy, m.tests, timeout, stop_first=True)
    finally:
        with open(os.path.join(copy, m.path), "w") as fh:
            fh.write(original)
    took = time.monotonic() - t0
    if rc == 0:
        counts = outcome_counts(out)
        if not counts.get("passed"):
            # Nothing ran (a missing tool, not root): no verdict, not a hole in the suite.
            reasons = "; ".join(skip_reasons(out)[:3]) or out[-500:]
            return Outcome(m, "error", f"every test was skipped: {reasons}", took)
        skipped = f" ({counts['skipped']} skipped)" if counts.get("skipped") else ""
        return Outcome(m, "survived", f"every test passed{skipped}", took)
    if rc == 1:
        return Outcome(m, "caught", ", ".join(failed_tests(out)[:3]) or "a test failed", took)
    if rc == 124:
        return Outcome(m, "caught", out, took)  # a hang fails CI by its time limit
    return Outcome(m, "error", f"pytest exit {rc}:\n{out[-2000:]}", took)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="only these mutants")
    ap.add_argument("--worktree", action="store_true",
                    help="copy the work tree as it is now instead of HEAD")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the unmutated run of the selections")
    ap.add_argument("--keep", action="store_true", help="keep the copy (its path is printed)")
    ap.add_argument("--tests", default="",
                    help="comma-separated pytest selection to run instead of each entry's "
                         "(e.g. to see that an e2e test catches it too)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.tests:
        chosen = [replace(m, tests=tuple(args.tests.split(","))) for m in chosen]
    if unknown := set(args.names) - {m.name for m in MUTANTS}:
        print(f"mutants: unknown names {sorted(unknown)}", file=sys.stderr)
        return 2
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:34} {m.path:30} {' '.join(m.tests)}\n{'':34} {m.behaviour}")
        return 0
    top, copy = make_copy(args.worktree)
    try:
        check = subprocess.run([sys.executable, "-c", "import crishim; print(crishim.__file__)"],
                               cwd=copy, env=test_env(copy), capture_output=True, text=True)
        if not check.stdout.startswith(copy):
            print(f"mutants: the copy's crishim is not the one imported: {check.stdout}"
                  f"{check.stderr}", file=sys.stderr)
            return 1
        print(f"mutants: {len(chosen)} in {copy} "
              f"({'work tree' if args.worktree else 'HEAD'})", flush=True)
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            t0 = time.monotonic()
            rc, out = pytest(copy, tests, args.timeout * 2, stop_first=False)
            if rc != 0:
                print(f"mutants: the unmutated baseline fails (exit {rc}); a mutant caught by "
                      f"a failing test proves nothing:\n{out[-4000:]}")
                return 1
            counts = outcome_counts(out)
            skipped = f", {counts['skipped']} tests skipped" if counts.get("skipped") else ""
            print(f"baseline: {len(tests)} selections pass unmutated "
                  f"({time.monotonic() - t0:.0f}s{skipped})", flush=True)
            for reason in skip_reasons(out)[:5]:
                print(f"  skipped: {reason}", flush=True)
        outcomes: list[Outcome] = []
        for m in chosen:
            o = run_mutant(copy, m, args.timeout)
            outcomes.append(o)
            print(f"{o.verdict:9} {m.name:34} {o.seconds:4.0f}s  {o.detail}", flush=True)
        bad = [o for o in outcomes if o.verdict != "caught"]
        print(f"mutants: {len(outcomes) - len(bad)} of {len(outcomes)} caught"
              + (f"; not caught: {', '.join(f'{o.mutant.name} ({o.verdict})' for o in bad)}"
                 if bad else ""))
        return 1 if bad else 0
    finally:
        if args.keep:
            print(f"mutants: copy kept at {copy}")
        else:
            shutil.rmtree(top, ignore_errors=True)  # the link only, not what it points at


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
