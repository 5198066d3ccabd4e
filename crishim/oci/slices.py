"""systemd slice names for the systemd cgroup driver.

runc's systemd driver takes a cgroupsPath "<slice>:<prefix>:<name>" and asks systemd for a
transient scope "<prefix>-<name>.scope" in <slice>; systemd nests slices by their dashes
("a-b.slice" lives in "a.slice"). The kubelet on the systemd driver hands the pod's parent
as that nesting spelt out ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-
pod<uid>.slice"). A cgroupfs path ("/kubepods/burstable/pod<uid>") names no slice: taking
its last component as one would put the pod in a top-level "pod<uid>.slice", outside
kubepods.slice, which systemd keeps after the pod is gone. Such a parent is refused.
"""

from __future__ import annotations


def expand_slice(name: str) -> str:
    """'a-b-c.slice' → '/a.slice/a-b.slice/a-b-c.slice' (systemd's slice nesting)."""
    if name in ("", "-.slice"):
        return ""
    base = name.removesuffix(".slice")
    parts = base.split("-")
    return "/" + "/".join("-".join(parts[:i]) + ".slice" for i in range(1, len(parts) + 1))


def parent_slice(parent: str) -> str:
    """The slice a pod's cgroup_parent names under the systemd driver ("system.slice" for
    none). Raises ValueError for a parent that is no slice, or a path whose nesting is not
    the slice's own (systemd would put the pod somewhere else than the path says)."""
    if not parent.strip("/"):
        return "system.slice"
    name = parent.rstrip("/").rsplit("/", 1)[-1]
    if not name.endswith(".slice") or name == ".slice" or "--" in name \
            or name.startswith("-") or name.endswith("-.slice"):
        raise ValueError(
            f"cgroup_parent {parent!r} is not a systemd slice, and crishim runs the systemd "
            "cgroup driver: give a slice such as 'kubepods-burstable-pod<uid>.slice' (the "
            "kubelet does so with cgroupDriver: systemd)")
    if "/" in parent and "/" + parent.strip("/") != expand_slice(name):
        raise ValueError(
            f"cgroup_parent {parent!r} does not match the nesting of its slice {name!r} "
            f"({expand_slice(name)!r}), and systemd places a slice only by its name")
    return name


def cgroup_relpath(cgroups_path: str) -> str:
    """An OCI cgroupsPath (cgroupfs '/a/b' or systemd 'slice:prefix:name') → '/a/b' form."""
    if "/" not in cgroups_path and ":" not in cgroups_path and cgroups_path.endswith(".slice"):
        return expand_slice(cgroups_path) or "/"  # a systemd cgroup parent: a bare slice
    if cgroups_path.startswith("/") or ":" not in cgroups_path:
        return "/" + cgroups_path.strip("/")
    parent, prefix, name = [*cgroups_path.split(":"), "", ""][:3]
    if name.endswith(".slice"):
        return expand_slice(name) or "/"
    unit = f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
    return expand_slice(parent or "system.slice") + "/" + unit
