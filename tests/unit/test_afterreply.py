"""Work left behind by a call runs on a worker thread, and only after the call's step."""

from __future__ import annotations

import logging
import threading

import pytest

from crishim.afterreply import AfterReply


async def test_the_work_starts_after_the_current_step_on_another_thread() -> None:
    ran: list[tuple[str, int]] = []
    work = AfterReply()
    work.run("note", lambda what: ran.append((what, threading.get_ident())), "x")
    # Still in the step that asked (where a handler writes its reply): nothing ran yet.
    assert ran == []
    await work.settle()
    assert ran[0][0] == "x" and ran[0][1] != threading.get_ident()


async def test_a_failure_is_logged_and_goes_no_further(caplog: pytest.LogCaptureFixture) -> None:
    def fail(path: str) -> None:
        raise OSError(f"cannot delete {path}")

    work = AfterReply()
    with caplog.at_level(logging.WARNING):
        work.run("deleting files", fail, "/x")
        await work.settle()
    assert "background work failed" in caplog.text
    fields = getattr(caplog.records[-1], "kv", {})
    assert fields == {"work": "deleting files", "error": "cannot delete /x"}
