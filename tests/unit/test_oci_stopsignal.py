"""Stop signals: every CRI Signal name, image STOPSIGNAL forms, and what status reports."""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.oci.resources import ResourceMapper
from crishim.oci.stopsignal import reported, stop_signal
from crishim.store.container import Container
from crishim.validate.container import validate_container_config

# The kubelet (ContainerStopSignals) turns the pod's lifecycle.stopSignal string into the
# CRI enum by name: "SIGRTMIN+1" → SIGRTMINPLUS1, "SIGRTMAX-1" → SIGRTMAXMINUS1.
KUBELET_STRINGS = {
    "SIGABRT": 6, "SIGALRM": 14, "SIGBUS": 7, "SIGCHLD": 17, "SIGCLD": 17, "SIGCONT": 18,
    "SIGFPE": 8, "SIGHUP": 1, "SIGILL": 4, "SIGINT": 2, "SIGIO": 29, "SIGIOT": 6,
    "SIGKILL": 9, "SIGPIPE": 13, "SIGPOLL": 29, "SIGPROF": 27, "SIGPWR": 30, "SIGQUIT": 3,
    "SIGSEGV": 11, "SIGSTKFLT": 16, "SIGSTOP": 19, "SIGSYS": 31, "SIGTERM": 15, "SIGTRAP": 5,
    "SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22, "SIGURG": 23, "SIGUSR1": 10, "SIGUSR2": 12,
    "SIGVTALRM": 26, "SIGWINCH": 28, "SIGXCPU": 24, "SIGXFSZ": 25, "SIGRTMIN": 34,
    **{f"SIGRTMIN+{i}": 34 + i for i in range(1, 16)},
    **{f"SIGRTMAX-{i}": 64 - i for i in range(1, 15)},
    "SIGRTMAX": 64,
}


def _kubelet_config(stop: str) -> pb.ContainerConfig:
    """What kuberuntime's generateContainerConfig sends for lifecycle.stopSignal."""
    enum = stop.replace("+", "PLUS").replace("-", "MINUS")
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                              image=pb.ImageSpec(image="sha256:" + "a" * 64,
                                                 user_specified_image="busybox"),
                              stop_signal=enum)


def test_every_cri_signal_name_has_its_linux_number() -> None:
    old = [k for k in pb.Signal.keys() if not k.startswith("SIGNAL_")]
    assert len(KUBELET_STRINGS) == len(old) - 1  # all but RUNTIME_DEFAULT
    for name, number in KUBELET_STRINGS.items():
        cfg = _kubelet_config(name)
        # The request wins over the image's STOPSIGNAL.
        assert stop_signal(cfg, {"StopSignal": "SIGQUIT"}) == number, name
        assert reported(cfg, number) == cfg.stop_signal, name


def test_the_signal_prefixed_names_are_the_same_signals() -> None:
    # cri-api after 1.36 spells every value SIGNAL_<1.36 name>, with the same number.
    for name, number in KUBELET_STRINGS.items():
        enum = "SIGNAL_" + name.replace("+", "PLUS").replace("-", "MINUS")
        cfg = pb.ContainerConfig(stop_signal=pb.Signal.Value(enum))
        assert cfg.stop_signal == _kubelet_config(name).stop_signal, name
        assert stop_signal(cfg, {}) == number, name
    assert pb.SIGNAL_RUNTIME_DEFAULT == pb.RUNTIME_DEFAULT
    assert stop_signal(pb.ContainerConfig(stop_signal=pb.SIGNAL_RUNTIME_DEFAULT), {}) == 15
    # An image's STOPSIGNAL is reported by its 1.36 name, as before.
    assert pb.Signal.Name(reported(pb.ContainerConfig(), 3)) == "SIGQUIT"


@pytest.mark.parametrize(("value", "number"), [
    ("SIGQUIT", 3), ("QUIT", 3), ("sigquit", 3), ("3", 3), ("9", 9), ("SIGKILL", 9),
    ("SIGRTMIN+3", 37), ("RTMIN+3", 37), ("SIGRTMAX-2", 62), ("SIGRTMAX", 64),
    ("SIGRTMIN", 34), ("SIGCLD", 17), (" SIGUSR1 ", 10), ("", 15),
])
def test_image_stopsignal_forms(value: str, number: int) -> None:
    assert stop_signal(pb.ContainerConfig(), {"StopSignal": value}) == number


@pytest.mark.parametrize("value", ["SIGNOPE", "0", "65", "SIGRTMIN+31", "SIGRTMAX-31",
                                   "RTMIN+x", "-1", "SIG_DFL"])
def test_bad_image_stopsignal_is_invalid_argument(value: str) -> None:
    with pytest.raises(InvalidArgument, match="STOPSIGNAL"):
        stop_signal(pb.ContainerConfig(), {"StopSignal": value})


def test_unknown_enum_value_is_invalid_argument() -> None:
    """Refused at the door (validate/container.py)."""
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"),
                                image=pb.ImageSpec(image="busybox"),
                                stop_signal=99)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not a CRI Signal"):
        validate_container_config(config, ResourceMapper())


def test_status_reports_the_signal_actually_used() -> None:
    cfg = pb.ContainerConfig()
    # No request: the image's STOPSIGNAL, canonically named; SIGTERM when neither is set.
    assert reported(cfg, stop_signal(cfg, {"StopSignal": "QUIT"})) == pb.SIGQUIT
    assert reported(cfg, stop_signal(cfg, {"StopSignal": "SIGCLD"})) == pb.SIGCHLD
    assert reported(cfg, stop_signal(cfg, {"StopSignal": "35"})) == pb.SIGRTMINPLUS1
    assert reported(cfg, stop_signal(cfg, {"StopSignal": "SIGRTMAX-1"})) == pb.SIGRTMAXMINUS1
    assert reported(cfg, stop_signal(cfg, {})) == pb.SIGTERM
    # A number CRI has no name for (glibc's reserved 32) is RUNTIME_DEFAULT.
    assert reported(cfg, 32) == pb.RUNTIME_DEFAULT


def test_container_status_carries_it() -> None:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"))
    rec = Container(id="c", pod_id="p", name="n", config=cfg, runtime_handler="runc",
                    created_at=1, image_name="img", image_id="sha256:x", image_ref="sha256:x",
                    bundle="/b", rootfs="/r", persist_dir="/p",
                    stop_signal=stop_signal(cfg, {"StopSignal": "SIGUSR1"}))
    assert rec.status_proto().stop_signal == pb.SIGUSR1
    # Records written before the field was reported keep their number and report it.
    again = Container.from_dict(rec.to_dict())
    assert again.status_proto().stop_signal == pb.SIGUSR1
    kube = _kubelet_config("SIGRTMIN+1")
    rec.config = kube
    rec.stop_signal = stop_signal(kube, {})
    assert (rec.stop_signal, rec.status_proto().stop_signal) == (35, pb.SIGRTMINPLUS1)
