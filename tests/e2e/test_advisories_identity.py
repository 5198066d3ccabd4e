"""The advisory record, identities and resources: each published containerd or CRI-O
advisory of these classes, performed against crishim through the real socket.

- Supplementary groups (containerd CVE-2023-25173, CRI-O CVE-2022-2995): a file whose
  group is denied what others may do is denied to a member of that group in the image's
  /etc/group; a numeric user gets exactly the groups the image and request give, never
  the daemon's own.
- Ids past the 32-bit range (containerd CVE-2024-40635): refused, never wrapped to 0,
  whether from the request, the image's USER or its /etc/passwd and /etc/group. Like
  runc (and containerd after its fix), the largest id is 2^31 - 1.
- passwd injection (CRI-O CVE-2022-4318): crishim writes no passwd or group line; a newline
  and a colon in an env value or a user name leave the image's files byte-identical.
- ExecSync output (containerd CVE-2022-31030): bounded reply and daemon memory, whatever
  the command prints.
- Abandoned terminals (containerd CVE-2022-23471): tty exec and attach clients that send
  resizes and vanish leave no fd, thread or process behind.

One daemon for the module (started with a supplementary group of its own, so a group
kept from it would show), one busybox-based image per USER value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.streaming.client import spdy_connect, websocket_connect
from tests.e2e import imagebuild as ib
from tests.e2e.cni import module_network
from tests.e2e.lifecycle import Env, daemon_env, exec_sync
from tests.e2e.registry import Registry
from tests.e2e.sandboxes import pod_config, running_pod

# A group the daemon process holds and no image or request names.
DAEMON_GROUP = 31337
# The largest uid or gid runc (and containerd since CVE-2024-40635) accepts.
MAX_ID = 2**31 - 1
OUT_OF_RANGE = (-1, 2**31, 2**32 - 1, 2**32)

RESTRICTED_GID = 5555  # /secret's group: its members may not read it, others may
EXTRA_GID = 4242
PASSWD = ib.PASSWD + (
    "big:x:4294967296:1000::/:/bin/sh\n"
    "neg:x:-1:1000::/:/bin/sh\n"
    "past-int32:x:2147483648:1000::/:/bin/sh\n"
    "neg-gid:x:1002:-1::/:/bin/sh\n"
    # A name that reads as a uid past the range, mapped to root (the name must never be
    # looked up in place of the number).
    "4294967296:x:0:0::/root:/bin/sh\n"
    "grouped:x:1001:1001::/:/bin/sh\n"
)
GROUP = ib.GROUP + (
    f"restricted:x:{RESTRICTED_GID}:app\n"
    f"extra:x:{EXTRA_GID}:app\n"
    "huge:x:4294967296:grouped\n"
)
SECRET = b"readable by others, not by the restricted group\n"


def identity_layer() -> list[ib.Entry]:
    return [ib.file("etc/passwd", PASSWD), ib.file("etc/group", GROUP),
            ib.file("secret", SECRET, mode=0o604, gid=RESTRICTED_GID)]


@pytest.fixture(scope="module")
def env(registry: Registry, busybox_ref: str) -> Iterator[Env]:
    saved = os.getgroups()
    with contextlib.ExitStack() as stack:
        # The daemon (and so conmon and runc) inherits this group: a container that kept
        # the runtime's groups would show it.
        os.setgroups([*saved, DAEMON_GROUP])
        try:
            e = stack.enter_context(daemon_env(registry, busybox_ref, "crishim-advid",
                                               *module_network("advisories-identity")))
        finally:
            os.setgroups(saved)
        yield e


_images: dict[str, str] = {}


def image(env: Env, user: str) -> str:
    """The identity image with `user` as its USER, pushed and pulled (once per value)."""
    if user not in _images:
        tag = "u-" + re.sub(r"[^A-Za-z0-9_.-]", "_", user or "none")
        img = ib.build_busybox(extra_layers=[identity_layer()],
                               config_overrides={"User": user} if user else {})
        ib.push_image(env.registry.host, "test/adv-ident", tag, img)
        ref = ib.ref(env.registry.host, "test/adv-ident", tag)
        env.d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)),
                                 timeout=60)
        _images[user] = ref
    return _images[user]


@pytest.fixture(scope="module")
def pod(env: Env) -> Iterator[tuple[str, pb.PodSandboxConfig]]:
    cfg = pod_config("advid", log_directory=os.path.join(env.tmpdir, "logs", "advid"))
    with running_pod(env.rt(), cfg) as sid:
        yield sid, cfg


_names = 0


def config(ref: str, cmd: list[str], sc: pb.LinuxContainerSecurityContext | None = None,
           envs: dict[str, str] | None = None) -> pb.ContainerConfig:
    global _names
    _names += 1
    sc = sc or pb.LinuxContainerSecurityContext()
    # Its own pid namespace: /proc/1 is the container's process.
    sc.namespace_options.pid = pb.CONTAINER
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=f"c{_names}"), image=pb.ImageSpec(image=ref),
        command=cmd, log_path=f"c{_names}.log",
        envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in (envs or {}).items()],
        linux=pb.LinuxContainerConfig(security_context=sc))


def create(env: Env, pod: tuple[str, pb.PodSandboxConfig], cfg: pb.ContainerConfig) -> str:
    sid, pod_cfg = pod
    return str(env.rt().CreateContainer(pb.CreateContainerRequest(
        pod_sandbox_id=sid, config=cfg, sandbox_config=pod_cfg), timeout=60).container_id)


@contextlib.contextmanager
def running(env: Env, pod: tuple[str, pb.PodSandboxConfig], cfg: pb.ContainerConfig
            ) -> Iterator[str]:
    cid = create(env, pod, cfg)
    try:
        env.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
        yield cid
    finally:
        env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)


def refused(env: Env, pod: tuple[str, pb.PodSandboxConfig], cfg: pb.ContainerConfig,
            code: grpc.StatusCode) -> str:
    """CreateContainer of `cfg` fails with `code` and leaves no container; its message."""
    before = len(env.rt().ListContainers(pb.ListContainersRequest(), timeout=10).containers)
    with pytest.raises(grpc.RpcError) as info:
        cid = create(env, pod, cfg)
        # Not refused at create: it must not start either (and is cleaned up).
        try:
            env.rt().StartContainer(pb.StartContainerRequest(container_id=cid), timeout=30)
        finally:
            env.rt().RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)
    assert info.value.code() == code, info.value.details()
    after = len(env.rt().ListContainers(pb.ListContainersRequest(), timeout=10).containers)
    assert after == before
    return str(info.value.details())


def ids(env: Env, cid: str, pid: str = "1") -> tuple[int, int, list[int]]:
    """(uid, gid, groups) of process `pid` in the container, from /proc/<pid>/status."""
    text = exec_sync(env, cid, ["cat", f"/proc/{pid}/status"]).stdout.decode()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return (int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]),
            sorted(int(g) for g in fields["Groups"].split()))


def daemon_groups(env: Env) -> list[int]:
    assert env.d.proc is not None
    with open(f"/proc/{env.d.proc.pid}/status") as fh:
        line = next(li for li in fh if li.startswith("Groups:"))
    return [int(g) for g in line.split(":", 1)[1].split()]


# --- supplementary groups ------------------------------------------------------------------

def test_cve_2023_25173_image_user_gets_its_etc_group_groups_and_is_denied_by_them(
        env: Env, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    assert DAEMON_GROUP in daemon_groups(env)
    for user in ("app", "1000", "1000:1000"):
        with running(env, pod, config(image(env, user), ["sleep", "3600"])) as cid:
            for pid in ("1", "self"):  # the container's process and an exec'd one
                assert ids(env, cid, pid) == (1000, 1000,
                                              sorted([1000, EXTRA_GID, RESTRICTED_GID])), user
            # The attack: read a file whose group is denied, as a member of that group.
            res = exec_sync(env, cid, ["cat", "/secret"])
            assert res.exit_code != 0 and b"Permission denied" in res.stderr, user
            st = env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                          timeout=10).status.user.linux
            assert sorted(st.supplemental_groups) == sorted([1000, EXTRA_GID, RESTRICTED_GID])


def test_cve_2022_2995_numeric_user_gets_exactly_the_requested_groups_never_the_daemons(
        env: Env, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    assert DAEMON_GROUP in daemon_groups(env)
    cases = [
        # (security context, expected uid, gid, groups)
        (pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=4321)),
         4321, 0, [0]),
        (pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=4321),
                                          run_as_group=pb.Int64Value(value=4322),
                                          supplemental_groups=[777]),
         4321, 4322, [777, 4322]),
        # The image's member user, its /etc/group ignored under the Strict policy.
        (pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=1000),
                                          supplemental_groups=[777],
                                          supplemental_groups_policy=pb.Strict),
         1000, 1000, [777, 1000]),
    ]
    for sc, uid, gid, groups in cases:
        with running(env, pod, config(image(env, ""), ["sleep", "3600"], sc)) as cid:
            for pid in ("1", "self"):
                assert ids(env, cid, pid) == (uid, gid, groups), sc


# --- ids past the range --------------------------------------------------------------------

@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_cve_2024_40635_uid_past_int32_is_refused_not_wrapped(
        env: Env, pod: tuple[str, pb.PodSandboxConfig], value: int) -> None:
    ref = image(env, "")
    cases = {
        "run_as_user": pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=value)),
        "run_as_group": pb.LinuxContainerSecurityContext(
            run_as_user=pb.Int64Value(value=1000), run_as_group=pb.Int64Value(value=value)),
        "supplemental_groups[1]": pb.LinuxContainerSecurityContext(
            run_as_user=pb.Int64Value(value=1000), supplemental_groups=[7, value]),
    }
    for what, sc in cases.items():
        msg = refused(env, pod, config(ref, ["true"], sc), grpc.StatusCode.INVALID_ARGUMENT)
        assert what in msg and str(value) in msg and str(MAX_ID) in msg, msg


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_cve_2024_40635_pod_ids_past_int32_are_refused(env: Env, value: int) -> None:
    cases = {
        "run_as_user": pb.LinuxSandboxSecurityContext(run_as_user=pb.Int64Value(value=value)),
        "run_as_group": pb.LinuxSandboxSecurityContext(
            run_as_user=pb.Int64Value(value=1000), run_as_group=pb.Int64Value(value=value)),
        "supplemental_groups[0]": pb.LinuxSandboxSecurityContext(supplemental_groups=[value]),
    }
    for what, sc in cases.items():
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="advid-bad", namespace="e2e", uid="uid-bad"),
            linux=pb.LinuxPodSandboxConfig(security_context=sc))
        with pytest.raises(grpc.RpcError) as info:
            sid = env.rt().RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                         timeout=60).pod_sandbox_id
            env.rt().StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
            env.rt().RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid),
                                      timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        msg = info.value.details()
        assert what in msg and str(value) in msg and str(MAX_ID) in msg, msg
    listed = env.rt().ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
    assert not any(p.metadata.name == "advid-bad" for p in listed)


@pytest.mark.parametrize("user", ["4294967296", "-1", "2147483648", "0:4294967296",
                                  "1000:-1", "1000:2147483648", "big", "neg", "past-int32",
                                  "neg-gid", "grouped"])
def test_cve_2024_40635_image_user_past_int32_is_refused_not_wrapped(
        env: Env, pod: tuple[str, pb.PodSandboxConfig], user: str) -> None:
    msg = refused(env, pod, config(image(env, user), ["id"]),
                  grpc.StatusCode.FAILED_PRECONDITION)
    assert "image" in msg and str(MAX_ID) in msg, msg


def test_cve_2024_40635_the_largest_id_runs_as_itself(
        env: Env, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    sc = pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=MAX_ID),
                                          run_as_group=pb.Int64Value(value=MAX_ID),
                                          supplemental_groups=[MAX_ID])
    with running(env, pod, config(image(env, ""), ["sleep", "3600"], sc)) as cid:
        assert ids(env, cid) == (MAX_ID, MAX_ID, [MAX_ID])
    with running(env, pod, config(image(env, f"{MAX_ID}:{MAX_ID}"), ["sleep", "3600"])) as cid:
        assert ids(env, cid) == (MAX_ID, MAX_ID, [MAX_ID])


# --- passwd and group lines ----------------------------------------------------------------

INJECTED = "/tmp\nroot2:x:0:0:injected:/root:/bin/sh\n"


def test_cve_2022_4318_newline_and_colon_never_reach_a_passwd_or_group_line(
        env: Env, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    ref = image(env, "")
    # crishim writes no passwd or group entry for a uid the image lacks (CRI-O did, with
    # HOME from the env): the files stay the image's, byte for byte, and the env is only
    # the env.
    sc = pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=4321),
                                          run_as_group=pb.Int64Value(value=4321))
    envs = {"HOME": INJECTED, "USER": "evil:x:0:0::/:/bin/sh", "GROUP": "g:x:0:app\n"}
    with running(env, pod, config(ref, ["sleep", "3600"], sc, envs)) as cid:
        assert exec_sync(env, cid, ["cat", "/etc/passwd"]).stdout == PASSWD.encode()
        assert exec_sync(env, cid, ["cat", "/etc/group"]).stdout == GROUP.encode()
        assert ids(env, cid) == (4321, 4321, [4321])
        shown = exec_sync(env, cid, ["sh", "-c", 'printf %s "$HOME"']).stdout
        assert shown == INJECTED.encode()
        # Nobody in the container is root2 (no line was added for it).
        assert exec_sync(env, cid, ["id", "root2"]).exit_code != 0
    # A user name carrying a line is no name: refused, nothing created.
    for name in ("app\nroot2:x:0:0::/:/bin/sh", "app:x:0:0", "root2"):
        sc = pb.LinuxContainerSecurityContext(run_as_username=name)
        msg = refused(env, pod, config(ref, ["true"], sc), grpc.StatusCode.INVALID_ARGUMENT)
        assert "not found in the image's /etc/passwd" in msg, msg


# --- ExecSync output -----------------------------------------------------------------------

REPLY_MAX = 16 * 1024 * 1024  # crishim.container.execsync: what one reply holds


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(li for li in fh if li.startswith("VmRSS:")).split()[1])


@contextlib.contextmanager
def peak_rss(pid: int) -> Iterator[list[int]]:
    """[baseline, peak] of `pid`'s RSS in KiB while the block runs (sampled every 10 ms)."""
    out = [rss_kib(pid), 0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            out[1] = max(out[1], rss_kib(pid))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out[1] = max(out[1], rss_kib(pid))


@pytest.fixture(scope="module")
def sleeper(env: Env, pod: tuple[str, pb.PodSandboxConfig]) -> Iterator[str]:
    with running(env, pod, config(image(env, ""), ["sleep", "3600"])) as cid:
        yield cid


def test_cve_2022_31030_execsync_output_is_bounded_whatever_the_command_prints(
        env: Env, sleeper: str) -> None:
    assert env.d.proc is not None
    mib = 256
    # No newline anywhere, on both streams at once.
    script = (f"head -c {mib << 20} /dev/zero & head -c {mib << 20} /dev/zero | tr '\\0' e >&2; "
              "wait; exit 3")
    with peak_rss(env.d.proc.pid) as rss:
        res = exec_sync(env, sleeper, ["sh", "-c", script], timeout=60)
    assert res.exit_code == 3
    assert len(res.stdout) + len(res.stderr) <= REPLY_MAX
    assert len(res.stdout) >= REPLY_MAX // 4 and len(res.stderr) >= REPLY_MAX // 4
    assert res.stdout.count(b"\0") == len(res.stdout) and set(res.stderr) == {ord("e")}
    grown_mib = (rss[1] - rss[0]) / 1024
    # 2 x 256 MiB went through; the daemon held a bounded part of it.
    assert grown_mib < 100, f"the daemon grew by {grown_mib:.0f} MiB"


def test_cve_2022_31030_execsync_printing_forever_ends_at_its_timeout(
        env: Env, sleeper: str) -> None:
    assert env.d.proc is not None
    start = time.monotonic()
    with peak_rss(env.d.proc.pid) as rss, pytest.raises(grpc.RpcError) as info:
        exec_sync(env, sleeper, ["sh", "-c", "exec cat /dev/zero # forever-4545"], timeout=3)
    took = time.monotonic() - start
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value.details()
    assert "timed out" in info.value.details()
    assert took < 3 + 10  # the runtime's own setup has its own limit, well below this
    assert (rss[1] - rss[0]) / 1024 < 100
    deadline = time.monotonic() + 10
    while "forever-4545" in (ps := exec_sync(env, sleeper, ["ps", "-o", "args"]).stdout
                             .decode()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "forever-4545" not in ps, ps


# --- abandoned terminals -------------------------------------------------------------------

CLIENTS = 16  # per kind and round
RESIZES = 50  # each client's resize events, before it vanishes


async def _until_output(read: Callable[[], Awaitable[bytes | None]], want: bytes) -> None:
    seen = b""
    while want not in seen:
        data = await read()
        if data is None:
            raise AssertionError(f"the session ended before {want!r}: {seen!r}")
        seen += data


async def abandon_spdy(url: str, stdin: bytes, want: bytes) -> None:
    """A tty session over SPDY that gets going, sends resizes and vanishes (the TCP
    connection aborted: no stream closed, no goodbye)."""
    conn, _, reader = await spdy_connect(url, ("v4.channel.k8s.io",))

    async def read() -> bytes | None:
        return await out.read() or None

    try:
        err = await conn.open_stream({"streamType": "error"})
        out = await conn.open_stream({"streamType": "stdout"})
        resize = await conn.open_stream({"streamType": "resize"})
        for i in range(RESIZES):
            await resize.write(json.dumps({"Width": 80 + i, "Height": 24}).encode())
        # stdin last: what it makes the shell print goes to an attached stdout.
        sin = await conn.open_stream({"streamType": "stdin"})
        await sin.write(stdin)
        try:
            await _until_output(read, want)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; error stream: {await err.read()!r}") from None
    finally:
        conn.writer.transport.abort()  # type: ignore[attr-defined]
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def abandon_websocket(url: str, stdin: bytes, want: bytes) -> None:
    ws, _ = await websocket_connect(url, ("v5.channel.k8s.io",))
    try:
        for i in range(RESIZES):
            await ws.send(b"\x04" + json.dumps({"Width": 80 + i, "Height": 24}).encode())
        await ws.send(b"\x00" + stdin)

        errors = []

        async def read() -> bytes | None:
            msg = await ws.recv()
            if msg is None:
                return None
            if msg[1][:1] == b"\x03":
                errors.append(msg[1][1:])
            return msg[1][1:] if msg[1][:1] == b"\x01" else b""

        try:
            await _until_output(read, want)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; error channel: {errors!r}") from None
    finally:
        ws.writer.transport.abort()


def daemon_use(env: Env) -> tuple[int, int, int]:
    """(open fds, threads, RSS KiB) of the daemon."""
    assert env.d.proc is not None
    pid = env.d.proc.pid
    return (len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task")),
            rss_kib(pid))


def conmon_pids(cid: str) -> list[int]:
    """The running conmon processes of container `cid` (a session's early end with the
    container still running tells conmon's exit apart from a closed connection)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if args[0].endswith(b"conmon") and cid.encode() in args:
            found.append(int(pid))
    return found


def runtime_children(env: Env) -> list[str]:
    """Command lines of the daemon's child processes other than conmon (runc exec and
    its helpers while a session lives)."""
    assert env.d.proc is not None
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            if ppid != env.d.proc.pid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if "conmon" not in cmd:
            out.append(cmd)
    return out


def test_cve_2022_23471_abandoned_tty_sessions_with_resizes_leave_nothing_behind(
        env: Env, pod: tuple[str, pb.PodSandboxConfig]) -> None:
    ref = image(env, "")
    shell = config(ref, ["sh"])
    shell.tty = shell.stdin = True
    with running(env, pod, config(ref, ["sleep", "3600"])) as target, \
            running(env, pod, shell) as attached:

        def urls() -> tuple[str, str]:
            ex = env.rt().Exec(pb.ExecRequest(
                container_id=target, cmd=["sh", "-c", "echo ready; exec sleep 4646"],
                tty=True, stdin=True, stdout=True), timeout=10).url
            at = env.rt().Attach(pb.AttachRequest(container_id=attached, stdin=True,
                                                  stdout=True, tty=True), timeout=10).url
            return str(ex), str(at)

        async def round_() -> None:
            # All at once: a burst of attaches also fills conmon's attach backlog.
            sessions = []
            for i in range(CLIENTS):
                ex, at = await asyncio.to_thread(urls)
                mark = f"at-{i}-{time.monotonic_ns()}".encode()
                abandon = abandon_spdy if i % 2 else abandon_websocket
                sessions.append(abandon(ex, b"", b"ready"))
                # Quoted apart: only the command's output, not the shell's echo of the
                # line typed, holds the mark.
                typed = mark.replace(b"-", b'-""', 1)
                sessions.append(abandon(at, b"echo " + typed + b"\n", mark + b"\r\n"))
            try:
                await asyncio.gather(*sessions)
            except AssertionError as exc:
                st = env.rt().ContainerStatus(pb.ContainerStatusRequest(
                    container_id=attached), timeout=10).status
                raise AssertionError(f"{exc}; the attached container: {st.state} "
                                     f"{st.exit_code} {st.reason}, its conmon: "
                                     f"{conmon_pids(attached) or 'gone'}") from None

        def settled(base: tuple[int, int, int]) -> tuple[int, int, int]:
            """The daemon's use once its fds are back to `base`'s (or the deadline)."""
            deadline = time.monotonic() + 30
            while True:
                now = daemon_use(env)
                left = exec_sync(env, target, ["ps", "-o", "args"]).stdout.decode()
                done = (now[0] <= base[0] and "sleep 4646" not in left
                        and not runtime_children(env))
                if done or time.monotonic() > deadline:
                    return now
                time.sleep(0.2)

        asyncio.run(asyncio.wait_for(round_(), 120))  # warm-up: lazy fds, pools, caches
        base = settled(daemon_use(env))
        for _ in range(3):
            asyncio.run(asyncio.wait_for(round_(), 120))
        after = settled(base)
        assert after[0] <= base[0], f"fds {base[0]} -> {after[0]}"
        # The daemon's thread pools (spawn, reap, the default executor) start threads lazily
        # up to fixed caps, so a few may appear late; a leak would add one per session,
        # 3 x 2 x CLIENTS here.
        assert after[1] < base[1] + CLIENTS, f"threads {base[1]} -> {after[1]}"
        grown_mib = (after[2] - base[2]) / 1024
        assert grown_mib < 16, f"RSS grew by {grown_mib:.1f} MiB over 3 x {2 * CLIENTS} sessions"
        assert "sleep 4646" not in exec_sync(env, target, ["ps", "-o", "args"]).stdout.decode()
        assert runtime_children(env) == []
        # A client that leaves does not end what it attached to.
        st = env.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=attached),
                                      timeout=10).status
        assert st.state == pb.CONTAINER_RUNNING, (st.exit_code, st.reason)
