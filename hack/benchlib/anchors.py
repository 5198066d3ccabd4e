"""The containerd builds crishim is compared against ("anchors").

`--containerd PATH[,SHIM]` names one (repeatable). By default: Debian's /usr/bin/containerd
and, when present, the containerd 2.3.4 in ../shared/anchors (most clusters run 2.x). Each
anchor is named after its version (`containerd-1.6.20`), which keys its column and ratio.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

SHIM = "containerd-shim-runc-v2"
DEBIAN = "/usr/bin/containerd"
SHARED_2X = ("shared", "anchors", "containerd-2.3.4", "containerd")


@dataclass(frozen=True)
class Anchor:
    binary: str
    shim: str  # containerd-shim-runc-v2 this containerd must use
    version: str  # "1.6.20", "2.3.4"; "" when --version did not say

    @property
    def name(self) -> str:
        return f"containerd-{self.version}" if self.version else "containerd"

    @property
    def major(self) -> int:
        """1 or 2: picks the config format (version 2 vs 3). Unknown counts as 1."""
        head = self.version.split(".", 1)[0]
        return int(head) if head.isdigit() else 1


def parse_version(output: str) -> str:
    """The release from `containerd --version`: "containerd github.com/containerd/
    containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3" → "1.6.20"; "... v2.3.4 <sha>" → "2.3.4"."""
    fields = output.split()
    for word in fields[2:3] or fields[1:]:
        m = re.match(r"v?(\d+\.\d+\.\d+)", word)
        if m:
            return m.group(1)
    return ""


def parse_spec(spec: str) -> tuple[str, str]:
    """"PATH[,SHIM]" → (containerd, shim). The shim defaults to the one next to the binary,
    else the one on PATH beside /usr/bin (what containerd itself would find)."""
    binary, _, shim = spec.partition(",")
    binary = os.path.abspath(binary)
    if not shim:
        beside = os.path.join(os.path.dirname(binary), SHIM)
        shim = beside if os.path.exists(beside) else os.path.join("/usr/bin", SHIM)
    return binary, os.path.abspath(shim)


def default_specs(repo_root: str) -> list[str]:
    specs = [DEBIAN] if os.access(DEBIAN, os.X_OK) else []
    shared = os.path.join(os.path.dirname(repo_root), *SHARED_2X)
    if os.access(shared, os.X_OK):
        specs.append(shared)
    return specs


def resolve(spec: str) -> Anchor:
    binary, shim = parse_spec(spec)
    for path in (binary, shim):
        if not os.access(path, os.X_OK):
            raise ValueError(f"--containerd {spec}: {path} is not an executable")
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"--containerd {spec}: {binary} --version: {exc}") from None
    return Anchor(binary, shim, parse_version(out))


def resolve_all(specs: list[str]) -> list[Anchor]:
    """Anchors in the order given; a repeated version gets a suffix so columns stay apart."""
    out: list[Anchor] = []
    for spec in specs:
        a = resolve(spec)
        taken = {x.name for x in out}
        n = 2
        while a.name in taken:
            a = Anchor(a.binary, a.shim, f"{a.version or '0'}#{n}")
            n += 1
        out.append(a)
    return out
