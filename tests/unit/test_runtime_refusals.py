"""A runtime that cannot run on this host is the handler's fault, not a bug: its refusal
is FAILED_PRECONDITION with the runtime's own words."""

from __future__ import annotations

import pytest

from crishim.runtime.runc import OCIRuntimeError


@pytest.mark.parametrize("text", [
    "crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2",
    "create: cgroups in hybrid mode not supported",
])
def test_hybrid_cgroups_refusal_is_failed_precondition(text: str) -> None:
    exc = OCIRuntimeError(text)
    assert exc.code.name == "FAILED_PRECONDITION"
    assert "hybrid mode" in str(exc)


def test_other_runtime_failures_stay_internal() -> None:
    assert OCIRuntimeError("crun: mount `proc`: Operation not permitted").code.name == \
        "INTERNAL"
