"""Start-up reconciliation of pods (crishim/sandbox/recover.py) through the real
SandboxManager, with the fakes of tests/fakes/sandbox.py at the boundary (fake runtime, fake
CNI, netns pins as plain files): a RunPodSandbox a crash cut short is rolled back, a stop
and a remove cut short are finished by the next StopPodSandbox/RemovePodSandbox."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from crishim.sandbox import build as sandbox_build
from crishim.sandbox import manager as sandbox_manager
from crishim.sandbox.manager import SandboxManager
from crishim.store.sandbox import KIND, NOTREADY, READY
from tests.fakes.host import alive as _alive
from tests.fakes.host import exists as _exists
from tests.fakes.sandbox import env as env  # the fixture
from tests.fakes.sandbox import pod_config as _config


class Crash(BaseException):
    """The daemon dying at a crash point: nothing after it runs, no cleanup catches it."""


def crash_at(monkeypatch: pytest.MonkeyPatch, step: str) -> list[str]:
    """Crash at `step` while the returned list holds it (cleared: the daemon restarts
    without it; monkeypatch.undo would also undo the env's fakes)."""
    armed = [step]

    def point(name: str) -> None:
        if name in armed:
            raise Crash(name)
    for module in (sandbox_manager, sandbox_build):  # the RPC steps, and what a run builds
        monkeypatch.setattr(module, "crash_point", point)
    return armed


async def gone(env: SimpleNamespace, mgr: SandboxManager) -> None:
    """The daemon is gone: pauses, netns pins, files and records remain."""
    await mgr.stop()
    mgr.stores.pods.clear()
    env.managers.remove(mgr)


@pytest.mark.parametrize("step", ["sandbox-after-intent", "sandbox-after-netns",
                                  "sandbox-after-cni-add", "sandbox-before-pause-start",
                                  "sandbox-before-ready"])
async def test_an_interrupted_run_is_rolled_back(env: SimpleNamespace,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 step: str) -> None:
    first = await env.manager()
    armed = crash_at(monkeypatch, step)

    async def died(sb: object) -> None:
        """A dead process rolls nothing back in place: the next start must."""

    monkeypatch.setattr(first.parts.builder, "rollback", died)
    with pytest.raises(Crash):
        await first.run_sandbox(_config("cut"), "")
    intents = await env.db.intents(KIND)
    assert len(intents) == 1, intents
    (sid,) = intents
    await gone(env, first)
    armed.clear()
    pins = os.path.join(env.cfg.state, "netns", sid)

    mgr = await env.manager()
    assert mgr.find(sid) is None and mgr.list_sandboxes() == []
    assert await env.db.intents(KIND) == {}, "the interrupted run's intent stayed"
    assert await env.db.load_all(KIND) == {}
    assert await env.runtime.state(sid) is None, "the half-made pod's pause stayed"
    assert not _exists(os.path.join(env.cfg.root, "sandboxes", sid))
    assert not _exists(pins)
    if step != "sandbox-after-intent":  # a netns existed: its network is released
        assert ("teardown", sid) in env.net.calls, env.net.calls
    # The name is free again.
    assert mgr.get(await mgr.run_sandbox(_config("cut"), "")).state == READY


# The in-process "dead" daemon's pause watch still fires after its manager stopped; a
# real crash has no such callback left.
@pytest.mark.filterwarnings("ignore:coroutine 'PauseWatch.on_exit' was never awaited"
                            ":RuntimeWarning")
async def test_a_stop_cut_short_leaves_a_notready_pod_that_stops_again(
        env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    first = await env.manager()
    sid = await first.run_sandbox(_config("stopcut"), "")
    pid = first.get(sid).pid
    armed = crash_at(monkeypatch, "sandbox-stop-after-teardown")
    with pytest.raises(Crash):
        await first.stop_sandbox(sid)
    assert (await env.db.load_all(KIND))[sid]["state"] == READY  # not persisted yet
    await gone(env, first)
    armed.clear()

    mgr = await env.manager()
    sb = mgr.get(sid)
    assert sb.state == NOTREADY and not _alive(pid), "a pod without its pause is not READY"
    assert (await env.db.load_all(KIND))[sid]["state"] == NOTREADY
    await mgr.stop_sandbox(sid)
    await mgr.remove_sandbox(sid)
    assert mgr.list_sandboxes() == [] and await env.db.load_all(KIND) == {}
    assert await env.runtime.list() == []


@pytest.mark.parametrize("step", ["sandbox-remove-after-containers",
                                  "sandbox-remove-before-delete"])
async def test_a_half_removed_pod_is_listed_and_removed_again(
        env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    first = await env.manager()
    sid = await first.run_sandbox(_config("half"), "")
    await first.stop_sandbox(sid)
    armed = crash_at(monkeypatch, step)
    with pytest.raises(Crash):
        await first.remove_sandbox(sid)
    await gone(env, first)
    armed.clear()

    mgr = await env.manager()
    sb = mgr.get(sid)
    assert sb.state == NOTREADY
    await mgr.remove_sandbox(sid)
    assert mgr.find(sid) is None and await env.db.load_all(KIND) == {}
    await mgr.parts.teardown.after_reply.settle()
    assert not _exists(os.path.join(env.cfg.root, "sandboxes", sid))
    assert await env.runtime.list() == []
