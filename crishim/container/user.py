"""Resolve the container's uid/gid/groups from the image USER, the CRI security context,
and the rootfs's /etc/passwd and /etc/group.

The rootfs is untrusted image content: /etc/passwd may be a symlink to /etc/shadow of the
HOST if followed naively, so every path is resolved inside the rootfs (`scoped_path`),
with absolute links and `..` clamped at the rootfs root, like a chroot would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from crishim.errors import InvalidArgument

MAX_SYMLINKS = 40


def scoped_path(root: str, path: str) -> str:
    """`path` interpreted inside `root` with every symlink resolved within `root`.

    The result always lies under `root` (components that do not exist are kept as-is).
    """
    root = os.path.abspath(root)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or does not exist
            resolved.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise InvalidArgument(f"too many levels of symbolic links resolving {path!r} "
                                  "in the image rootfs")
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return os.path.join(root, *resolved)


def _read_db(root: str, name: str) -> list[list[str]]:
    try:
        with open(scoped_path(root, name), encoding="utf-8", errors="replace") as fh:
            text = fh.read(4 << 20)
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        rows.append(line.split(":"))
    return rows


@dataclass
class PasswdEntry:
    name: str
    uid: int
    gid: int
    home: str


@dataclass
class GroupEntry:
    name: str
    gid: int
    members: list[str]


def read_passwd(root: str) -> list[PasswdEntry]:
    out = []
    for row in _read_db(root, "/etc/passwd"):
        if len(row) >= 4 and row[2].isdigit() and row[3].isdigit():
            out.append(PasswdEntry(row[0], int(row[2]), int(row[3]),
                                   row[5] if len(row) > 5 else ""))
    return out


def read_group(root: str) -> list[GroupEntry]:
    out = []
    for row in _read_db(root, "/etc/group"):
        if len(row) >= 3 and row[2].isdigit():
            members = [m for m in (row[3].split(",") if len(row) > 3 else []) if m]
            out.append(GroupEntry(row[0], int(row[2]), members))
    return out


@dataclass
class ResolvedUser:
    uid: int = 0
    gid: int = 0
    additional_gids: list[int] = field(default_factory=list)
    username: str = ""
    home: str = ""


@dataclass
class UserRequest:
    """What the CRI asked for (None/empty = not set)."""

    run_as_user: int | None = None
    run_as_username: str = ""
    run_as_group: int | None = None
    supplemental_groups: list[int] = field(default_factory=list)
    strict_groups: bool = False  # SupplementalGroupsPolicy Strict


def _lookup_user(passwd: list[PasswdEntry], spec: str) -> PasswdEntry | None:
    if spec.isdigit():
        return next((p for p in passwd if p.uid == int(spec)), None)
    return next((p for p in passwd if p.name == spec), None)


def _lookup_group(groups: list[GroupEntry], spec: str) -> int:
    if spec.isdigit():
        return int(spec)
    for g in groups:
        if g.name == spec:
            return g.gid
    raise InvalidArgument(f"group {spec!r} not found in the image's /etc/group")


def validate_request(req: UserRequest) -> None:
    """Refuse what no user lookup can make sense of (as containerd and CRI-O do)."""
    if req.run_as_group is not None and req.run_as_user is None and not req.run_as_username:
        raise InvalidArgument(f"run_as_group {req.run_as_group} is set without run_as_user or "
                              "run_as_username; set the user too")


def resolve_user(rootfs: str, image_user: str, req: UserRequest) -> ResolvedUser:
    """uid/gid/additional gids for the container process.

    CRI run_as_user / run_as_username win over the image USER; run_as_group overrides the
    primary group. Supplementary groups: the user's groups from /etc/group (unless Strict),
    then the CRI supplemental groups.
    """
    validate_request(req)
    passwd = read_passwd(rootfs)
    groups = read_group(rootfs)
    if req.run_as_user is not None or req.run_as_username:
        user_part = (str(req.run_as_user) if req.run_as_user is not None
                     else req.run_as_username)
        group_part = ""
    else:
        user_part, _, group_part = (image_user or "").partition(":")
    out = ResolvedUser()
    if user_part:
        entry = _lookup_user(passwd, user_part)
        if entry is None:
            if not user_part.isdigit():
                raise InvalidArgument(f"user {user_part!r} not found in the image's /etc/passwd")
            out.uid = int(user_part)
        else:
            out.uid, out.gid, out.username, out.home = (entry.uid, entry.gid, entry.name,
                                                        entry.home)
    else:
        root = _lookup_user(passwd, "0")
        if root is not None:
            out.gid, out.username, out.home = root.gid, root.name, root.home
    if group_part:
        out.gid = _lookup_group(groups, group_part)
    if req.run_as_group is not None:
        out.gid = req.run_as_group
    # The primary gid comes first, as containerd reports it (the kubelet shows this list).
    gids: list[int] = [out.gid]
    if out.username and not req.strict_groups:
        gids.extend(g.gid for g in groups if out.username in g.members)
    gids.extend(req.supplemental_groups)
    seen: set[int] = set()
    for gid in gids:
        if gid not in seen:
            seen.add(gid)
            out.additional_gids.append(gid)
    return out
