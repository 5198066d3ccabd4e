"""crishim's default seccomp profile (RuntimeDefault) and profile loading.

The default is an allow-list: every syscall an ordinary program needs is allowed, and
everything else fails with EPERM. What it keeps out of unprivileged containers:
namespace creation and joining (unshare, setns, clone with CLONE_NEW*), mounts, pivot_root,
the kernel keyring (keyctl, add_key, request_key), module loading, kexec, reboot, swap,
bpf, perf, userfaultfd, ptrace of other processes, clock setting, and the obsolete/
dangerous calls (acct, quotactl, lookup_dcookie, nfsservctl, ...). Some of these come
back when the container holds the capability that already governs them (CAP_SYS_ADMIN
for mount/unshare/setns, CAP_SYS_PTRACE for ptrace, ...), as Docker's profile does.
clone3 answers ENOSYS so that libc falls back to clone, whose flags can be inspected.
"""

from __future__ import annotations

import json
import platform
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument

EPERM = 1
ENOSYS = 38

# Namespace flags of clone(2): CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
# (|NEWTIME is in the low byte's exit-signal space for clone, so only clone3 carries it).
CLONE_NS_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | \
    0x20000000 | 0x40000000

_ALLOWED = """
accept accept4 access adjtimex alarm arch_prctl bind brk cachestat capget capset chdir
chmod chown chown32 clock_adjtime clock_adjtime64 clock_getres clock_getres_time64
clock_gettime clock_gettime64 clock_nanosleep clock_nanosleep_time64 close close_range
connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1 epoll_ctl
epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve
execveat exit exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate
fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32 fchownat fcntl fcntl64
fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64 fstatat64
fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64 futex_wait
futex_waitv futex_wake futimesat getcpu getcwd getdents getdents64 getegid getegid32
geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer getpeername getpgid
getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid getresuid32
getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid
gettimeofday getuid getuid32 getxattr inotify_add_watch inotify_init inotify_init1
inotify_rm_watch io_cancel ioctl io_destroy io_getevents io_pgetevents
io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc kill landlock_add_rule
landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat
listen listxattr llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise
map_shadow_stack membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat
mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify mq_open mq_timedreceive
mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap msgctl msgget
msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat
_newselect open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc
pkey_free pkey_mprotect poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64
process_mrelease pselect6 pselect6_time64 pwrite64 pwritev pwritev2 read readahead
readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg
remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq
rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend
rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_getaffinity sched_getattr
sched_getparam sched_get_priority_max sched_get_priority_min sched_getscheduler
sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr
sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop
semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto
setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer
setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32
setreuid setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area
set_tid_address setuid setuid32 setxattr shmat shmctl shmdt shmget shutdown sigaltstack
signalfd signalfd4 sigprocmask sigreturn socketcall socketpair splice stat stat64 statfs
statfs64 statx symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time
timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime
timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime
timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat
utime utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev
arm_fadvise64_64 arm_sync_file_range sync_file_range2 breakpoint cacheflush set_tls
riscv_flush_icache riscv_hwprobe
""".split()

# Syscalls that the named capability already governs; allowed only when it is held.
_BY_CAPABILITY: dict[str, list[str]] = {
    "CAP_SYS_ADMIN": ["bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount",
                      "fsopen", "fspick", "lookup_dcookie", "mount", "mount_setattr",
                      "move_mount", "open_tree", "perf_event_open", "quotactl",
                      "quotactl_fd", "setdomainname", "sethostname", "setns", "syslog",
                      "umount", "umount2", "unshare"],
    "CAP_SYS_BOOT": ["reboot"],
    "CAP_SYS_CHROOT": ["chroot"],
    "CAP_SYS_MODULE": ["delete_module", "init_module", "finit_module"],
    "CAP_SYS_PACCT": ["acct"],
    "CAP_SYS_PTRACE": ["kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv",
                       "process_vm_writev", "ptrace"],
    "CAP_SYS_RAWIO": ["iopl", "ioperm"],
    "CAP_SYS_TIME": ["settimeofday", "stime", "clock_settime", "clock_settime64"],
    "CAP_SYS_TTY_CONFIG": ["vhangup"],
    "CAP_SYS_NICE": ["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
    "CAP_SYSLOG": ["syslog"],
    "CAP_BPF": ["bpf"],
    "CAP_PERFMON": ["perf_event_open"],
}

# The native arch and the compat ABIs its kernel can run (a 32-bit binary must not be a
# way around the filter).
_ARCHES = {"x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
           "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
           "riscv64": ["SCMP_ARCH_RISCV64"]}

# personality(2) personas a normal program uses (PER_LINUX, PER_LINUX32, UNAME26 variants,
# and the 0xffffffff query).
_PERSONAS = [0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF]


def default_profile(capabilities: list[str]) -> dict[str, Any]:
    """The RuntimeDefault profile as an OCI `linux.seccomp` object for these capabilities."""
    caps = set(capabilities)
    syscalls: list[dict[str, Any]] = [{"names": list(_ALLOWED), "action": "SCMP_ACT_ALLOW"}]
    syscalls.extend({"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                     "args": [{"index": 0, "value": v, "op": "SCMP_CMP_EQ"}]}
                    for v in _PERSONAS)
    extra: list[str] = []
    for cap, names in _BY_CAPABILITY.items():
        if cap in caps:
            extra.extend(n for n in names if n not in extra)
    if "clone" not in extra:
        # clone without namespace flags is plain fork/thread creation.
        syscalls.append({"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                         "args": [{"index": 0, "value": CLONE_NS_MASK, "valueTwo": 0,
                                   "op": "SCMP_CMP_MASKED_EQ"}]})
    if "clone3" not in extra:
        # clone3's flags live in a struct seccomp cannot read: ENOSYS makes libc use clone.
        syscalls.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    if extra:
        syscalls.append({"names": extra, "action": "SCMP_ACT_ALLOW"})
    # socket(2) is allowed for every family except AF_VSOCK (40), which reaches the host.
    syscalls.append({"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                     "args": [{"index": 0, "value": 40, "op": "SCMP_CMP_NE"}]})
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": EPERM,
            "architectures": list(_ARCHES.get(platform.machine(), [])),
            "syscalls": syscalls}


def load_localhost_profile(path: str) -> dict[str, Any]:
    """A Localhost profile: an OCI/Docker-format seccomp JSON file on the node."""
    ref = path.removeprefix("localhost/")
    if not ref.startswith("/"):
        raise InvalidArgument(f"seccomp localhost profile {path!r} must be an absolute path")
    try:
        with open(ref, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise InvalidArgument(f"seccomp profile {ref} does not exist on the node") from None
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"seccomp profile {ref} cannot be loaded: {exc}") from None
    if not isinstance(data, dict) or "defaultAction" not in data:
        raise InvalidArgument(f"seccomp profile {ref} has no defaultAction")
    return _docker_to_oci(data)


def _docker_to_oci(data: dict[str, Any]) -> dict[str, Any]:
    """Accept Docker's format too: archMap → architectures, `name` → `names`."""
    out = {k: v for k, v in data.items() if k not in ("archMap", "syscalls")}
    if "archMap" in data and "architectures" not in data:
        arches: list[str] = []
        for entry in data["archMap"] or []:
            arches.append(entry["architecture"])
            arches.extend(entry.get("subArchitectures") or [])
        out["architectures"] = arches
    syscalls = []
    for rule in data.get("syscalls") or []:
        rule = {k: v for k, v in rule.items()
                if k in ("names", "name", "action", "args", "errnoRet")}
        if "name" in rule:
            rule.setdefault("names", []).append(rule.pop("name"))
        syscalls.append(rule)
    if syscalls:
        out["syscalls"] = syscalls
    return out


def select(profile: pb.SecurityProfile | None, legacy_path: str,
           caps: list[str]) -> dict[str, Any] | None:
    """The seccomp profile of a pod or container (None = unconfined).

    `profile` is the typed field when the kubelet set it; otherwise `legacy_path` is the
    deprecated string form, where "" means unconfined (the kubelet's old default)."""
    if profile is not None:
        kind, ref = profile.profile_type, profile.localhost_ref
    elif legacy_path in ("", "unconfined"):
        return None
    elif legacy_path in ("runtime/default", "docker/default"):
        kind, ref = pb.SecurityProfile.RuntimeDefault, ""
    elif legacy_path.startswith("localhost/"):
        kind, ref = pb.SecurityProfile.Localhost, legacy_path
    else:
        raise InvalidArgument(f"seccomp profile {legacy_path!r} is not unconfined, "
                              "runtime/default, docker/default or localhost/<path>")
    if kind == pb.SecurityProfile.Unconfined:
        return None
    if kind == pb.SecurityProfile.Localhost:
        return load_localhost_profile(ref)
    return default_profile(caps)
