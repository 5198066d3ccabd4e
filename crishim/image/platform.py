"""Pick the manifest of an index that matches this host (os/architecture/variant)."""

from __future__ import annotations

import platform as _platform
from typing import Any

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
         "armv7l": "arm", "armv6l": "arm", "i686": "386", "i386": "386",
         "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}


def host_platform() -> tuple[str, str, str]:
    machine = _platform.machine()
    arch = _ARCH.get(machine, machine)
    variant = ""
    if arch == "arm64":
        variant = "v8"
    elif arch == "arm":
        variant = "v6" if machine == "armv6l" else "v7"
    return "linux", arch, variant


def _variant_ok(arch: str, want: str, have: str) -> bool:
    if not have:
        return True
    if arch == "arm64":
        return have in ("v8", want)
    if arch == "arm":
        # An armv7 host can run v5/v6/v7 images, never v8.
        order = ["v5", "v6", "v7", "v8"]
        return have in order and want in order and order.index(have) <= order.index(want)
    return have == want


def select(manifests: list[dict[str, Any]],
           host: tuple[str, str, str] | None = None) -> dict[str, Any] | None:
    """The best entry for the host: exact variant first, then compatible ones."""
    os_, arch, variant = host or host_platform()
    best: tuple[int, dict[str, Any]] | None = None
    for m in manifests:
        p = m.get("platform") or {}
        if p.get("os") != os_ or p.get("architecture") != arch:
            continue
        have = p.get("variant", "")
        if not _variant_ok(arch, variant, have):
            continue
        score = 2 if have == variant else (1 if have else 0)
        if best is None or score > best[0]:
            best = (score, m)
    return best[1] if best else None
