"""CDI names: the `vendor.com/class` kind of a spec, device names, the qualified
`vendor.com/class=name` a container asks for, and the `cdi.k8s.io/*` annotations that
kubelets before the CDI_devices field use to carry them.

The character rules are the CDI specification's, as its reference library applies them:
vendor and class start with a letter and end with a letter or digit, with letters, digits,
`_`, `-` and `.` between; a device name starts and ends with a letter or digit and may
also hold `:` in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ANNOTATION_PREFIX = "cdi.k8s.io/"


class CDINameError(ValueError):
    """A malformed CDI kind, device name or qualified device name."""


@dataclass(frozen=True)
class QualifiedName:
    vendor: str
    cls: str
    name: str

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cls}"

    def __str__(self) -> str:
        return f"{self.vendor}/{self.cls}={self.name}"


def _alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _letter(c: str) -> bool:
    return c.isascii() and c.isalpha()


def _check(what: str, name: str, first_ok: bool, middle: str) -> None:
    if not name:
        raise CDINameError(f"empty {what}")
    if not first_ok:
        expect = "a letter" if what in ("vendor", "class") else "a letter or digit"
        raise CDINameError(f"{what} {name!r} must start with {expect}")
    for c in name[1:-1]:
        if not (_alnum(c) or c in middle):
            raise CDINameError(f"{what} {name!r} has the invalid character {c!r}")
    if not _alnum(name[-1]):
        raise CDINameError(f"{what} {name!r} must end with a letter or digit")


def validate_vendor(vendor: str) -> None:
    _check("vendor", vendor, bool(vendor) and _letter(vendor[0]), "_-.")


def validate_class(cls: str) -> None:
    _check("class", cls, bool(cls) and _letter(cls[0]), "_-.")


def validate_device_name(name: str) -> None:
    _check("device name", name, bool(name) and _alnum(name[0]), "_-.:")


def split_kind(kind: str) -> tuple[str, str]:
    """`vendor.com/class` → (vendor, class); raises for anything else."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        raise CDINameError(f"kind {kind!r} must be vendor/class (e.g. vendor.com/gpu)")
    validate_vendor(vendor)
    validate_class(cls)
    return vendor, cls


def parse_qualified(device: str) -> QualifiedName:
    """`vendor.com/class=name` → its parts; raises naming what is wrong."""
    kind, sep, name = device.partition("=")
    if not sep or not kind or not name or device.startswith("/"):
        raise CDINameError(f"{device!r} is not a qualified CDI device name "
                         "(vendor.com/class=name)")
    try:
        vendor, cls = split_kind(kind)
        validate_device_name(name)
    except CDINameError as exc:
        raise CDINameError(f"{device!r} is not a valid CDI device name: {exc}") from None
    return QualifiedName(vendor, cls, name)


def from_annotations(annotations: Mapping[str, str]) -> list[str]:
    """The devices named by `cdi.k8s.io/<key>: vendor.com/class=a,vendor.com/class=b`
    annotations, in key order; raises on a value that is not a list of qualified names."""
    out: list[str] = []
    for key in sorted(annotations):
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        for device in annotations[key].split(","):
            try:
                parse_qualified(device)
            except CDINameError as exc:
                raise CDINameError(f"annotation {key}: {exc}") from None
            out.append(device)
    return out


def requested(field_names: Sequence[str], annotations: Mapping[str, str]) -> list[str]:
    """The devices a container asks for: the CDI_devices field first, then the annotation
    ones, each once (a driver may name a device both ways while kubelets migrate)."""
    out: list[str] = []
    for device in field_names:
        try:
            parse_qualified(device)
        except CDINameError as exc:
            raise CDINameError(f"CDI_devices: {exc}") from None
    for device in [*field_names, *from_annotations(annotations)]:
        if device not in out:
            out.append(device)
    return out
