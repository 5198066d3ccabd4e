"""Where NRI plugins come from: the pre-installed executables (`plugin_path/NN-name`,
found in name order, started with one end of a socketpair, killed when dropped), their
drop-in config files, and the external plugins' socket (whether another runtime serves
it, who connected)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat

from crishim.nri.plugin import check_index, check_name
from crishim.proc.spawn import Child
from crishim.proc.spawn import start as spawn_start


def discover(path: str) -> list[tuple[str, str]]:
    """(idx, base) of the executables named NN-name in `path`, in name order; a badly
    named one is an error, as in containerd."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    found: list[tuple[str, str]] = []
    for e in entries:
        if e.is_dir():
            continue
        try:
            mode = e.stat().st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode) or not mode & 0o111:
            continue
        idx, sep, base = e.name.partition("-")
        why = (f"invalid plugin name {e.name!r}, NN-name expected" if not sep
               else check_index(idx) or check_name(base))
        if why is not None:
            raise ValueError(f"plugin {os.path.join(path, e.name)}: {why}")
        found.append((idx, base))
    return found


def read_config(config_dir: str, idx: str, base: str) -> str:
    """A plugin's drop-in config: `NN-name.conf`, else `name.conf`, else ""."""
    for name in (f"{idx}-{base}.conf", f"{base}.conf"):
        try:
            with open(os.path.join(config_dir, name)) as fh:
                return fh.read()
        except FileNotFoundError:
            continue
    return ""


async def launch(plugin_path: str, idx: str, base: str
                 ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Child]:
    """Start the pre-installed plugin `idx-base`; our end of its socketpair, and it."""
    path = os.path.join(plugin_path, f"{idx}-{base}")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # The plugin's whole environment, as containerd gives it.
        env = {"NRI_PLUGIN_NAME": base, "NRI_PLUGIN_IDX": idx,
               "NRI_PLUGIN_SOCKET": str(theirs.fileno())}
        child = await spawn_start([path], env=env, pass_fds=[theirs.fileno()])
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    return reader, writer, child


def answers(path: str) -> bool:
    """Whether a process accepts connections on the unix socket at `path`."""
    if not os.path.exists(path):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
    except OSError:
        return False
    finally:
        s.close()
    return True


def peer_pid(sock: socket.socket) -> int:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return 0
    return int.from_bytes(creds[:4], "little")


async def reap(child: Child) -> None:
    """A pre-installed plugin is killed once it is dropped or crishim stops, as
    containerd kills it."""
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    with contextlib.suppress(Exception):
        await child.wait()
