"""Stop signals: the CRI `Signal` enum and image STOPSIGNAL values as Linux signal numbers.

The kubelet (ContainerStopSignals, pod `lifecycle.stopSignal`) sends a CRI enum; images
carry STOPSIGNAL as "SIGQUIT", "QUIT", "SIGRTMIN+3" or "3". The CRI request wins over the
image, and SIGTERM is the default. ContainerStatus reports the signal actually used.
"""

from __future__ import annotations

import signal
from typing import Any, cast

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument

# User-space real-time range (glibc keeps 32 and 33 for itself), as runc and moby count.
SIGRTMIN = int(signal.SIGRTMIN)
SIGRTMAX = int(signal.SIGRTMAX)
DEFAULT = int(signal.SIGTERM)
_MAX_SIGNAL = 64  # _NSIG - 1 on Linux


def _classic(name: str) -> int | None:
    sig = getattr(signal, name, None)
    return int(sig) if isinstance(sig, signal.Signals) else None


def signal_number(name: str) -> int | None:
    """"SIGQUIT", "quit", "SIGRTMIN+3", "RTMAX-2" → the number; None when unknown."""
    key = name.strip().upper().removeprefix("SIG")
    for base, sign, at in (("RTMIN", "+", SIGRTMIN), ("RTMAX", "-", SIGRTMAX)):
        if key == base:
            return at
        if key.startswith(base + sign) and key[len(base) + 1:].isdigit():
            offset = int(key[len(base) + 1:])
            number = at + offset if sign == "+" else at - offset
            return number if SIGRTMIN <= number <= SIGRTMAX else None
    return _classic("SIG" + key) if key.isalnum() else None


def _enum_name(name: str) -> str:
    """A Signal enum name in 1.36's spelling: cri-api after 1.36 names the same values with
    a SIGNAL_ prefix (SIGNAL_SIGTERM, SIGNAL_RUNTIME_DEFAULT); api.proto has both."""
    return name.removeprefix("SIGNAL_")


def _enum_number(value: int) -> int:
    """A CRI Signal enum value → its signal number (PLUS/MINUS spell + and -)."""
    name = _enum_name(pb.Signal.Name(value)).replace("PLUS", "+").replace("MINUS", "-")
    number = signal_number(name)
    if number is None:  # every enum name maps; only a newer enum would get here
        raise InvalidArgument(f"stop signal {name} has no number on this host")
    return number


def _enum_by_number() -> dict[int, int]:
    # First name wins for aliases, so the canonical one is reported (SIGCHLD, not SIGCLD).
    aliases = {"SIGCLD", "SIGIOT", "SIGPOLL"}
    out: dict[int, int] = {}
    for name, value in pb.Signal.items():
        if value != pb.RUNTIME_DEFAULT and _enum_name(name) not in aliases:
            out.setdefault(_enum_number(value), value)
    return out


_ENUM_BY_NUMBER = _enum_by_number()


def image_stop_signal(value: str) -> int:
    """The image config's StopSignal as a number; empty means SIGTERM."""
    text = value.strip()
    if not text:
        return DEFAULT
    number = int(text) if text.isdigit() else signal_number(text)
    if number is None or not 0 < number <= _MAX_SIGNAL:
        raise InvalidArgument(f"image STOPSIGNAL {value!r} is not a Linux signal (use a name "
                              f"such as SIGQUIT or SIGRTMIN+3, or a number 1-{_MAX_SIGNAL})")
    return number


def stop_signal(config: pb.ContainerConfig, image_config: dict[str, Any]) -> int:
    """The signal StopContainer sends first: CRI stop_signal, else STOPSIGNAL, else SIGTERM."""
    if config.stop_signal != pb.RUNTIME_DEFAULT:  # a CRI Signal: validate/container.py
        return _enum_number(config.stop_signal)
    return image_stop_signal(str(image_config.get("StopSignal") or ""))


def reported(config: pb.ContainerConfig, number: int) -> pb.Signal:
    """ContainerStatus.stop_signal: what was asked for, else the enum of the number used
    (an image's STOPSIGNAL included); RUNTIME_DEFAULT only for a number CRI cannot name."""
    if config.stop_signal != pb.RUNTIME_DEFAULT:
        return config.stop_signal
    return cast(pb.Signal, _ENUM_BY_NUMBER.get(number, pb.RUNTIME_DEFAULT))
