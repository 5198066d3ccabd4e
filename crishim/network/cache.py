"""On-disk record of each pod's CNI attachment, so DEL can be replayed after a crash or a
config change: the exact network config, CNI_ARGS, runtimeConfig, netns and (once ADD
finished) the result. Written before ADD, atomically (write, then rename).

Not synced to disk, like the database's commits: a crash of crishim leaves the written
file in the page cache, which is what recovery needs, and power loss is outside the
recovery contract (docs/durability.md). A pod start thus never waits for a disk flush,
which on a busy disk takes tens of milliseconds."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from crishim.errors import InvalidArgument
from crishim.host import remove

FORMAT = 1


@dataclass
class CacheEntry:
    pod_id: str
    network: dict[str, Any]  # the whole conflist as used for ADD
    cni_args: str
    runtime_config: dict[str, Any]
    ifname: str
    netns: str
    result: dict[str, Any] | None = None  # None until ADD of the whole chain finished
    extra: dict[str, Any] = field(default_factory=dict)


class ResultCache:
    def __init__(self, directory: str) -> None:
        """`directory`: the configured cache dir (cni.cache_dir), the only place the
        cache deletes in."""
        self.directory = directory
        self.roots = (directory,)

    @staticmethod
    def valid_id(pod_id: str) -> bool:
        return bool(pod_id) and "/" not in pod_id and not pod_id.startswith(".")

    def _path(self, pod_id: str) -> str:
        if not self.valid_id(pod_id):
            raise InvalidArgument(f"invalid pod sandbox id {pod_id!r}")
        return os.path.join(self.directory, pod_id + ".json")

    def write(self, entry: CacheEntry) -> None:
        """Blocking; call via asyncio.to_thread."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        path = self._path(entry.pod_id)
        tmp = path + ".tmp"
        data = json.dumps({"format": FORMAT, **asdict(entry)}).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, path)

    def read(self, pod_id: str) -> CacheEntry | None:
        if not self.valid_id(pod_id):
            return None  # nothing can be cached under it
        try:
            with open(self._path(pod_id), "rb") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ValueError(f"corrupt CNI cache entry for {pod_id}: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"CNI cache entry for {pod_id} has an unknown format")
        data.pop("format")
        return CacheEntry(**data)

    def remove(self, pod_id: str) -> None:
        if not self.valid_id(pod_id):
            return
        remove.unlink(self._path(pod_id), self.roots)

    def remove_partial_writes(self) -> None:
        """Drop *.tmp files a crash left between write and rename (the old entry stands)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(".json.tmp"):
                remove.unlink(os.path.join(self.directory, name), self.roots)

    def pod_ids(self) -> set[str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return set()
        return {n[:-5] for n in names if n.endswith(".json") and not n.startswith(".")}
