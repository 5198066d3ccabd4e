"""ExecSync's timeout leaves no asyncio "exception was never retrieved" behind."""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

import pytest

from crishim.container.execsync import exec_sync
from crishim.errors import DeadlineExceeded
from crishim.runtime.runc import OCIRuntime
from tests.fakes.runtime import runtime  # noqa: F401  (the fake runtime fixture)


async def test_timed_out_exec_leaves_no_unretrieved_exception(
        runtime: OCIRuntime, tmp_path: Any) -> None:  # noqa: F811
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        for i in range(3):
            with pytest.raises(DeadlineExceeded, match="timed out"):
                await exec_sync(runtime, f"t{i}", {"args": ["sleep", "60"]},
                                os.path.join(str(tmp_path), "exec"), 0.3)
        for _ in range(5):  # let the cancelled children finish, then collect them
            await asyncio.sleep(0.05)
            gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert [r.get("message") for r in reports] == []
