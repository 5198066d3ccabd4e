"""A canary directory outside crishim's roots: what a hostile image, request or pod aims
at on the host; the tests snapshot it before the attack and compare after."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass


@dataclass
class Canary:
    path: str

    def snapshot(self) -> dict[str, tuple[int, int, bytes]]:
        """Every entry below (and of) the canary: mode, mtime, content or link target."""
        out: dict[str, tuple[int, int, bytes]] = {}
        for d, dirs, files in os.walk(self.path):
            for name in ["", *dirs, *files]:
                p = os.path.join(d, name) if name else d
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    with open(p, "rb") as fh:
                        body = fh.read()
                elif stat.S_ISLNK(st.st_mode):
                    body = os.readlink(p).encode()
                else:
                    body = b""
                out[os.path.relpath(p, self.path)] = (st.st_mode, st.st_mtime_ns, body)
        return out
