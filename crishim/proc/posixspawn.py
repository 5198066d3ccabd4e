"""glibc's posix_spawn through ctypes, called without the interpreter lock.

subprocess.Popen (and os.posix_spawn) keep the interpreter lock until the new process has
called exec. While pods start, that child waits for a CPU behind the runc, conmon and CNI
processes already running, and no thread of the daemon runs Python meanwhile: the event
loop stalled for tens of milliseconds at each start. A ctypes call releases the lock, so
only the calling thread waits for the exec.

The child gets what subprocess.Popen(close_fds=True, restore_signals=True) would give it:
only its stdio and `pass_fds` open (by number), SIGPIPE and SIGXFSZ back at their default
action, no blocked signals, and optionally its own session and working directory.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# <spawn.h>
SETSIGDEF = 0x04
SETSIGMASK = 0x08
SETSID = 0x80
# The opaque glibc types, with room to spare (x86-64 and arm64: 80 and 336 bytes).
_FILE_ACTIONS_SIZE = 256
_ATTR_SIZE = 1024
_SIGSET_SIZE = 128
# What Python sets to SIG_IGN and Popen(restore_signals=True) sets back.
_RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)

_Buffer = ctypes.Array[ctypes.c_char]
_Argv = ctypes.Array[ctypes.c_char_p]


@dataclass(frozen=True)
class Stdio:
    """What the child's fd 0, 1 and 2 are: an fd of ours to dup, or None for /dev/null."""
    stdin: int | None
    stdout: int | None
    stderr: int | None


def _strings(items: Sequence[bytes]) -> _Argv:
    arr = (ctypes.c_char_p * (len(items) + 1))()
    arr[:-1] = list(items)
    arr[-1] = None
    return arr


class PosixSpawn:
    """The libc functions, looked up once."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._libc = libc
        for name in ("posix_spawn", "posix_spawn_file_actions_init",
                     "posix_spawn_file_actions_destroy", "posix_spawn_file_actions_adddup2",
                     "posix_spawn_file_actions_addopen", "posix_spawn_file_actions_addclose",
                     "posix_spawn_file_actions_addclosefrom_np",
                     "posix_spawn_file_actions_addchdir_np", "posix_spawnattr_init",
                     "posix_spawnattr_destroy", "posix_spawnattr_setflags",
                     "posix_spawnattr_setsigdefault", "posix_spawnattr_setsigmask",
                     "sigemptyset", "sigaddset"):
            getattr(libc, name)  # AttributeError where one is missing (glibc < 2.34)
        libc.posix_spawnattr_setflags.argtypes = [ctypes.c_void_p, ctypes.c_short]
        libc.posix_spawn_file_actions_addopen.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint]

    @classmethod
    def load(cls) -> PosixSpawn:
        try:
            return cls(ctypes.CDLL(None, use_errno=True))
        except AttributeError as exc:
            raise OSError(errno.ENOSYS, f"crishim needs glibc 2.34 or later to start "
                          f"processes: {exc}") from None

    def spawn(self, program: str, argv: Sequence[str], env: Mapping[str, str], stdio: Stdio,
              *, cwd: str | None = None, pass_fds: Sequence[int] = (),
              new_session: bool = False) -> int:
        """Start `program` with `argv` and `env`; the child's pid. OSError (with the
        program's name) when it cannot be started, as Popen raises it."""
        libc = self._libc
        actions = ctypes.create_string_buffer(_FILE_ACTIONS_SIZE)
        attr = ctypes.create_string_buffer(_ATTR_SIZE)
        _check(libc.posix_spawn_file_actions_init(actions))
        try:
            _check(libc.posix_spawnattr_init(attr))
            try:
                self._file_actions(actions, stdio, cwd, pass_fds)
                self._attributes(attr, new_session)
                pid = ctypes.c_int(0)
                args = _strings([os.fsencode(a) for a in argv])
                envp = _strings([os.fsencode(k) + b"=" + os.fsencode(v)
                                 for k, v in env.items()])
                err = libc.posix_spawn(ctypes.byref(pid), os.fsencode(program), actions, attr,
                                       args, envp)
                if err:
                    # ENOENT from the chdir action names the directory, as Popen does.
                    missing_cwd = err == errno.ENOENT and cwd is not None and \
                        os.path.exists(program) and not os.path.isdir(cwd)
                    raise OSError(err, os.strerror(err), cwd if missing_cwd else program)
                return pid.value
            finally:
                libc.posix_spawnattr_destroy(attr)
        finally:
            libc.posix_spawn_file_actions_destroy(actions)

    def _file_actions(self, actions: _Buffer, stdio: Stdio, cwd: str | None,
                      pass_fds: Sequence[int]) -> None:
        libc = self._libc
        for target, fd in enumerate((stdio.stdin, stdio.stdout, stdio.stderr)):
            if fd is None:
                _check(libc.posix_spawn_file_actions_addopen(
                    actions, target, b"/dev/null", os.O_RDWR, 0))
            else:  # dup2 clears close-on-exec; an equal fd has it cleared (POSIX.1-2024)
                _check(libc.posix_spawn_file_actions_adddup2(actions, fd, target))
        keep = sorted(set(pass_fds))
        for fd in keep:
            _check(libc.posix_spawn_file_actions_adddup2(actions, fd, fd))
        # Close everything else, as Popen(close_fds=True): below the highest kept fd one by
        # one (a close of an fd that is not open is ignored), above it at once.
        low = 3
        for fd in keep:
            for other in range(low, fd):
                _check(libc.posix_spawn_file_actions_addclose(actions, other))
            low = fd + 1
        _check(libc.posix_spawn_file_actions_addclosefrom_np(actions, low))
        if cwd is not None:
            _check(libc.posix_spawn_file_actions_addchdir_np(actions, os.fsencode(cwd)))

    def _attributes(self, attr: _Buffer, new_session: bool) -> None:
        libc = self._libc
        default = ctypes.create_string_buffer(_SIGSET_SIZE)
        empty = ctypes.create_string_buffer(_SIGSET_SIZE)
        _check(libc.sigemptyset(default))
        _check(libc.sigemptyset(empty))
        for sig in _RESTORED:
            _check(libc.sigaddset(default, int(sig)))
        _check(libc.posix_spawnattr_setsigdefault(attr, default))
        _check(libc.posix_spawnattr_setsigmask(attr, empty))
        _check(libc.posix_spawnattr_setflags(
            attr, SETSIGDEF | SETSIGMASK | (SETSID if new_session else 0)))


def _check(err: int) -> None:
    """The posix_spawn* functions return an errno value; sigemptyset and sigaddset -1."""
    if err == -1:
        err = ctypes.get_errno()
    if err:
        raise OSError(err, os.strerror(err))
