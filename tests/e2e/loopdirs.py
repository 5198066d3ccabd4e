"""Which directories the event loop's own thread makes: a mkdir on disk can wait for
I/O (a directory block, the journal), and every call the daemon serves waits with it."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def mkdirs_on_this_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths os.mkdir is called with from the calling thread (the event loop's, in an
    async test) while the block runs; os.makedirs goes through os.mkdir too."""
    made: list[str] = []
    here = threading.get_ident()
    real = os.mkdir

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() == here:
            made.append(os.fspath(path))
        real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    yield made
