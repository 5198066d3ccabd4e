"""The CDI spec directories: which devices they define, re-read when they change.

Spec files are `*.json` and `*.yaml` directly in each directory (`cdi_spec_dirs`, by
default /etc/cdi then /var/run/cdi). A later directory has the higher priority: its
definition of a device replaces an earlier directory's. Two files of the same directory
defining the same device make that device unusable (both files are named when it is
asked for), unless a later directory defines it too. A file that cannot be loaded is left
out: the devices of other files stay usable, and asking for a device that no valid file
defines names the broken files that might have (those of the same kind, or whose kind
could not be read). This is how the CDI reference library behaves, too.

Nothing is watched: every lookup (a CreateContainer that asks for CDI devices) lists the
directories and stats their files in a worker thread, and only files whose identity
(inode, size, times) changed are read and parsed again. A file changed within the last
two seconds is re-read and compared, because a change in the same timestamp tick as the
previous read would otherwise go unseen. Containers that ask for no CDI device cost
nothing here.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from crishim.cdi.edits import Injection
from crishim.cdi.spec import Device, Spec, SpecError, load_document, parse_document, raw_kind
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.log import get_logger

log = get_logger(__name__)

SPEC_SUFFIXES = (".json", ".yaml")
# A file modified less than this long before it was read may change again unseen.
RACY_SECONDS = 2.0


@dataclass(frozen=True)
class _File:
    """One spec file as last read."""

    path: str
    priority: int
    identity: tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns
    read_at: float
    data: bytes
    spec: Spec | None
    kind: str  # what the file declares, also when it is invalid
    error: str


@dataclass
class _Index:
    """What the current files define."""

    devices: dict[str, tuple[_File, Device]] = field(default_factory=dict)
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    broken: list[_File] = field(default_factory=list)
    dir_errors: dict[str, str] = field(default_factory=dict)


class CDIRegistry:
    def __init__(self, spec_dirs: Sequence[str], enabled: bool = True) -> None:
        self.spec_dirs = [os.path.normpath(d) for d in spec_dirs]
        self.enabled = enabled
        self._files: dict[str, _File] = {}
        self._index = _Index()
        self._lock = asyncio.Lock()

    async def resolve(self, devices: Sequence[str]) -> list[Injection]:
        """The edits for `devices` (qualified names, each once), in the order to apply
        them: a spec's own edits once, before those of its first device asked for.
        Raises InvalidArgument naming any device that cannot be resolved."""
        if not devices:
            return []
        if not self.enabled:
            raise FailedPrecondition(f"CDI devices {', '.join(devices)} were requested but "
                                     "CDI is disabled on this node (enable_cdi = false)")
        async with self._lock:
            await asyncio.to_thread(self._refresh)
            index = self._index
        return self._injections(index, devices)

    # -- lookups --------------------------------------------------------------------------
    def _injections(self, index: _Index, devices: Sequence[str]) -> list[Injection]:
        missing: list[str] = []
        out: list[Injection] = []
        specs_done: set[str] = set()
        for name in devices:
            if name in index.conflicts:
                raise InvalidArgument(
                    f"CDI device {name} is defined by more than one spec file in the same "
                    f"directory ({', '.join(index.conflicts[name])}); remove all but one")
            found = index.devices.get(name)
            if found is None:
                missing.append(name)
                continue
            f, dev = found
            assert f.spec is not None
            if f.path not in specs_done:
                specs_done.add(f.path)
                if not f.spec.edits.empty():
                    out.append(Injection(f"CDI spec {f.path}", f.spec.edits))
            out.append(Injection(f"CDI device {name} ({f.path})", dev.edits))
        if missing:
            raise InvalidArgument(self._unresolved_message(index, missing))
        return out

    def _unresolved_message(self, index: _Index, missing: list[str]) -> str:
        what = "device" if len(missing) == 1 else "devices"
        msg = (f"unresolvable CDI {what} {', '.join(missing)}: no valid spec file in "
               f"{', '.join(self.spec_dirs)} defines {'it' if len(missing) == 1 else 'them'}")
        kinds = {n.partition("=")[0] for n in missing}
        related = [f for f in index.broken if f.kind in kinds or not f.kind]
        if related:
            msg += "; spec files with errors: " + "; ".join(f"{f.path}: {f.error}"
                                                           for f in related)
        if index.dir_errors:
            msg += "; unreadable spec directories: " + "; ".join(
                f"{d}: {e}" for d, e in index.dir_errors.items())
        return msg

    # -- reading the directories (in a worker thread) -------------------------------------
    def _refresh(self) -> None:
        files: dict[str, _File] = {}
        dir_errors: dict[str, str] = {}
        for priority, d in enumerate(self.spec_dirs):
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                dir_errors[d] = exc.strerror or str(exc)
                continue
            for entry in entries:
                if not entry.name.endswith(SPEC_SUFFIXES):
                    continue
                f = self._load(entry.path, priority)
                if f is not None:
                    files[f.path] = f
        changed = (files.keys() != self._files.keys()
                   or any(not _same(f, self._files[p]) for p, f in files.items())
                   or dir_errors != self._index.dir_errors)
        self._files = files
        if changed:
            self._index = _build_index(files, dir_errors)
            for f in self._index.broken:
                log.warning("CDI spec file is invalid; its devices are unavailable",
                            path=f.path, error=f.error)

    def _load(self, path: str, priority: int) -> _File | None:
        try:
            st = os.stat(path)
        except OSError:
            return None  # removed meanwhile, or a dangling link
        if not os.path.isfile(path):
            return None
        identity = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        old = self._files.get(path)
        if (old is not None and old.identity == identity and old.priority == priority
                and old.read_at - st.st_mtime_ns / 1e9 > RACY_SECONDS):
            return old
        read_at = time.time()
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            return _File(path, priority, identity, read_at, b"", None, "",
                         f"cannot read: {exc.strerror or exc}")
        if old is not None and old.data == data and old.priority == priority:
            # Unchanged: keep what was parsed, note when it was seen.
            return _File(path, priority, identity, read_at, data, old.spec, old.kind,
                         old.error)
        kind = ""
        try:
            doc = load_document(data, yaml_syntax=path.endswith(".yaml"))
            kind = raw_kind(doc)
            spec = parse_document(doc)
        except SpecError as exc:
            return _File(path, priority, identity, read_at, data, None, kind, str(exc))
        return _File(path, priority, identity, read_at, data, spec, spec.kind, "")


def _same(a: _File, b: _File) -> bool:
    return (a.spec is b.spec and a.error == b.error and a.priority == b.priority
            and a.kind == b.kind)


def _build_index(files: dict[str, _File], dir_errors: dict[str, str]) -> _Index:
    index = _Index(dir_errors=dict(dir_errors))
    # Lower priorities first, so a later directory's definition replaces them.
    for f in sorted(files.values(), key=lambda f: (f.priority, f.path)):
        if f.spec is None:
            index.broken.append(f)
            continue
        for dev in f.spec.devices:
            name = f"{f.spec.kind}={dev.name}"
            held = index.devices.get(name)
            if held is None or f.priority > held[0].priority:
                index.devices[name] = (f, dev)
                index.conflicts.pop(name, None)
            else:  # the same directory
                index.conflicts.setdefault(name, [held[0].path]).append(f.path)
    for name in index.conflicts:
        del index.devices[name]
    return index
