"""AppArmor: the default profile's text, the profile each kubelet request selects, and
the host probe on a machine without AppArmor."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import Config, ConfigError, validate
from crishim.container.apparmor import select_profile
from crishim.container.spec import PodInfo, SpecHost, SpecInputs, build_spec
from crishim.container.user import ResolvedUser
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.host.apparmor import AppArmorHost, HostIncludes, kernel_enabled
from crishim.oci.apparmor import AppArmorState, profile_text
from crishim.oci.resources import ResourceMapper
from crishim.runtime import apparmor
from crishim.validate.container import validate_container_config

ON = AppArmorState(enabled=True, default_profile="crishim-default", reason="loaded")
OFF = AppArmorState(reason="the kernel has no AppArmor")
BROKEN = AppArmorState(enabled=True, reason="default profile not loaded",
                       error="apparmor_parser -Kr crishim-default failed (1): syntax")
SP = pb.SecurityProfile
HOST = AppArmorHost(enabled=True, parser="/sbin/apparmor_parser")


def kubelet_sc(kind: str | None, name: str = "", privileged: bool = False
               ) -> pb.LinuxContainerSecurityContext:
    """What kuberuntime 1.36 sends for a container's AppArmor profile: the SecurityProfile
    field and, for older runtimes, the deprecated string; nothing when the pod sets none."""
    sc = pb.LinuxContainerSecurityContext(privileged=privileged)
    if kind == "RuntimeDefault":
        sc.apparmor.CopyFrom(SP(profile_type=SP.RuntimeDefault))
        sc.apparmor_profile = "runtime/default"
    elif kind == "Unconfined":
        sc.apparmor.CopyFrom(SP(profile_type=SP.Unconfined))
        sc.apparmor_profile = "unconfined"
    elif kind == "Localhost":
        sc.apparmor.CopyFrom(SP(profile_type=SP.Localhost, localhost_ref=name))
        sc.apparmor_profile = "localhost/" + name
    return sc


@pytest.mark.parametrize(("sc", "host", "want"), [
    (kubelet_sc(None), ON, "crishim-default"),  # unset: the default, as containerd/CRI-O
    (kubelet_sc("RuntimeDefault"), ON, "crishim-default"),
    (kubelet_sc("Unconfined"), ON, ""),
    (kubelet_sc("Localhost", "my-prof"), ON, "my-prof"),
    # privileged: RuntimeDefault does not confine; an explicit Localhost still does
    (kubelet_sc(None, privileged=True), ON, ""),
    (kubelet_sc("RuntimeDefault", privileged=True), ON, ""),
    (kubelet_sc("Localhost", "my-prof", privileged=True), ON, "my-prof"),
    # no AppArmor on the host: nothing is applied, whatever was asked
    (kubelet_sc(None), OFF, ""),
    (kubelet_sc("RuntimeDefault"), OFF, ""),
    (kubelet_sc("Localhost", "my-prof"), OFF, ""),
    # a configured apparmor_profile = "unconfined"
    (kubelet_sc("RuntimeDefault"), AppArmorState(enabled=True, reason="unconfined"), ""),
])
def test_selection(sc: pb.LinuxContainerSecurityContext, host: AppArmorState,
                   want: str) -> None:
    assert select_profile(sc, host) == want


@pytest.mark.parametrize(("old", "want"), [
    ("", "crishim-default"), ("runtime/default", "crishim-default"), ("unconfined", ""),
    ("localhost/legacy", "legacy"),
])
def test_deprecated_string_alone(old: str, want: str) -> None:
    # Older kubelets (and the beta annotation they translated) send only the string.
    sc = pb.LinuxContainerSecurityContext(apparmor_profile=old)
    assert select_profile(sc, ON) == want


@pytest.mark.parametrize(("sc", "rule"), [
    (pb.LinuxContainerSecurityContext(apparmor_profile="docker/x"), "localhost/<profile>"),
    (pb.LinuxContainerSecurityContext(apparmor_profile="localhost/"), "needs a localhost_ref"),
    (pb.LinuxContainerSecurityContext(apparmor=SP(profile_type=SP.Localhost)),
     "needs a localhost_ref"),
    (pb.LinuxContainerSecurityContext(apparmor=SP(profile_type=SP.Localhost,
                                                  localhost_ref="localhost/")),
     "needs a localhost_ref"),
    (pb.LinuxContainerSecurityContext(apparmor=SP(profile_type=SP.RuntimeDefault,
                                                  localhost_ref="x")),
     "only valid with the Localhost"),
])
def test_bad_requests_are_invalid_argument(sc: pb.LinuxContainerSecurityContext,
                                           rule: str) -> None:
    """Refused at the door (validate/container.py), before a profile is selected."""
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"),
                                image=pb.ImageSpec(image="busybox"),
                                linux=pb.LinuxContainerConfig(security_context=sc))
    with pytest.raises(InvalidArgument, match=rule):
        validate_container_config(config, ResourceMapper())


def test_unloadable_default_fails_loudly_not_unconfined() -> None:
    with pytest.raises(FailedPrecondition, match="default AppArmor profile is unavailable"):
        select_profile(kubelet_sc(None), BROKEN)
    # What does not need the default still works.
    assert select_profile(kubelet_sc("Unconfined"), BROKEN) == ""
    assert select_profile(kubelet_sc("Localhost", "p"), BROKEN) == "p"


def _spec(sc: pb.LinuxContainerSecurityContext, host: AppArmorState) -> dict[str, Any]:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"), command=["/bin/sh"],
                             linux=pb.LinuxContainerConfig(security_context=sc))
    return build_spec(SpecInputs(container_id="c1", config=cfg, pod=PodInfo(id="p"),
                                 image_config={}, image_name="img", rootfs="/r",
                                 user=ResolvedUser(), host=SpecHost(apparmor=host)))


def test_spec_carries_the_profile() -> None:
    assert _spec(kubelet_sc(None), ON)["process"]["apparmorProfile"] == "crishim-default"
    assert "apparmorProfile" not in _spec(kubelet_sc(None), OFF)["process"]
    assert "apparmorProfile" not in _spec(kubelet_sc("Unconfined"), ON)["process"]


def test_profile_text() -> None:
    text = profile_text("crishim-default", "unconfined", HostIncludes())
    lines = [line.strip() for line in text.splitlines()]
    assert "profile crishim-default flags=(attach_disconnected,mediate_deleted) {" in lines
    assert lines[0] == "@{PROC}=/proc/"  # no tunables on the host: defined inline
    for rule in ("deny mount,", "deny @{PROC}/sysrq-trigger rwklx,",
                 "deny @{PROC}/kcore rwklx,", "deny /sys/firmware/** rwklx,",
                 "deny /sys/kernel/security/** rwklx,",
                 "deny /sys/devices/virtual/powercap/** rwklx,",
                 "signal (receive) peer=unconfined,", "signal (receive) peer=runc,",
                 "signal (send,receive) peer=crishim-default,",
                 "ptrace (trace,tracedby,read,readby) peer=crishim-default,",
                 "network,", "capability,", "file,"):
        assert rule in lines, rule
    # The daemon's own label may signal its containers; listed once.
    confined = profile_text("x", "crishim-daemon", HostIncludes())
    assert confined.count("signal (receive) peer=crishim-daemon,") == 1
    assert profile_text("x", "unconfined").count("peer=unconfined,") == 1
    full = profile_text("x", includes=HostIncludes(abi3=True, tunables=True, base=True))
    assert full.startswith("abi <abi/3.0>,\n#include <tunables/global>\n")
    assert "  #include <abstractions/base>" in full


@pytest.mark.skipif(shutil.which("apparmor_parser") is None,
                    reason="apparmor_parser not installed (apt-get install apparmor)")
@pytest.mark.parametrize("includes", [HostIncludes(), HostIncludes.probe()])
def test_profile_parses(tmp_path: Path, includes: HostIncludes) -> None:
    path = tmp_path / "profile"
    path.write_text(profile_text("crishim-default", "unconfined", includes))
    # -Q: parse and compile only, nothing is loaded; -K: no cache.
    r = subprocess.run(["apparmor_parser", "-Q", "-K", str(path)], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


async def test_setup_without_kernel_support(monkeypatch: pytest.MonkeyPatch) -> None:
    state = await apparmor.setup("crishim-default", AppArmorHost())
    assert (state.enabled, state.default_profile, state.error) == (False, "", "")
    assert "no AppArmor" in state.reason
    assert state.info()["enabled"] is False


async def test_setup_loads_with_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], str]] = []

    async def fake_parser(parser: str, args: list[str], text: str) -> tuple[int, str]:
        calls.append((parser, args, text))
        return 0, ""

    monkeypatch.setattr(apparmor, "run_parser", fake_parser)
    state = await apparmor.setup("crishim-default", HOST)
    assert state == AppArmorState(enabled=True, default_profile="crishim-default",
                                  reason="loaded")
    [(_, args, text)] = calls
    assert args == ["-Kr"] and "profile crishim-default " in text
    # Someone else's profile is not generated: it must already be loaded.
    monkeypatch.setattr(apparmor, "is_loaded", lambda name: name == "site")
    assert (await apparmor.setup("site", HOST)).default_profile == "site"
    assert "not loaded" in (await apparmor.setup("other", HOST)).error
    assert (await apparmor.setup("unconfined", HOST)).default_profile == ""
    no_parser = await apparmor.setup("crishim-default", AppArmorHost(enabled=True))
    assert "apparmor_parser is not installed" in no_parser.reason
    assert len(calls) == 1


async def test_setup_reports_a_parser_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    async def failing(parser: str, args: list[str], text: str) -> tuple[int, str]:
        return 1, "syntax error"

    monkeypatch.setattr(apparmor, "run_parser", failing)
    state = await apparmor.setup("crishim-default", HOST)
    assert state.enabled and not state.default_profile and "syntax error" in state.error


def test_kernel_probe_on_this_kind_of_host(tmp_path: Path) -> None:
    assert not kernel_enabled(str(tmp_path / "missing"))
    (tmp_path / "sec").mkdir()
    (tmp_path / "enabled").write_text("Y\n")
    assert kernel_enabled(str(tmp_path / "sec"), str(tmp_path / "enabled"))
    (tmp_path / "enabled").write_text("N\n")
    assert not kernel_enabled(str(tmp_path / "sec"), str(tmp_path / "enabled"))


def test_config_key() -> None:
    assert Config().apparmor_profile == "crishim-default"
    cfg = Config()
    cfg.apparmor_profile = "two words"
    with pytest.raises(ConfigError, match="apparmor_profile"):
        validate(cfg)


def test_is_loaded(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.write_text("crishim-default (enforce)\nother (complain)\n")
    assert apparmor.is_loaded("crishim-default", str(profiles))
    assert not apparmor.is_loaded("crishim", str(profiles))
    assert not apparmor.is_loaded("x", os.path.join(tmp_path, "none"))
