"""Running a plugin binary: environment, hangs and garbage output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crishim.errors import DeadlineExceeded
from crishim.network.invoke import CNIPluginError, Invocation, exec_plugin
from crishim.observe import metrics


def script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "plugin"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


async def test_stdin_reaches_plugin_and_garbage_output_is_an_error(tmp_path: Path) -> None:
    plugin = script(tmp_path, 'cat > "$(dirname "$0")/stdin"; echo "not json"\n')
    with pytest.raises(CNIPluginError, match="invalid JSON"):
        await exec_plugin(plugin, {"name": "n"}, Invocation("DEL", "c1", "", "eth0", "A=1",
                                                            "/x:/y"))
    assert json.loads((tmp_path / "stdin").read_text()) == {"name": "n"}


async def test_hanging_plugin_is_killed(tmp_path: Path) -> None:
    plugin = script(tmp_path, "exec sleep 30\n")
    with pytest.raises(DeadlineExceeded, match="did not finish"):
        await exec_plugin(plugin, {}, Invocation("ADD"), limit_seconds=0.3)


async def test_empty_output_is_no_result(tmp_path: Path) -> None:
    plugin = script(tmp_path, "cat >/dev/null\n")
    assert await exec_plugin(plugin, {}, Invocation("DEL")) is None


async def test_each_run_is_timed_by_plugin_and_command(tmp_path: Path) -> None:
    plugin = script(tmp_path, "cat >/dev/null\n")

    def runs() -> float:
        return metrics.REGISTRY.get_sample_value(
            "crishim_cni_plugin_duration_seconds_count",
            {"plugin": "plugin", "command": "CHECK"}) or 0.0

    before = runs()
    await exec_plugin(plugin, {}, Invocation("CHECK"))
    assert runs() == before + 1


async def test_nonzero_exit_without_json_uses_stderr(tmp_path: Path) -> None:
    plugin = script(tmp_path, "echo 'netlink: permission denied' >&2; exit 3\n")
    with pytest.raises(CNIPluginError) as err:
        await exec_plugin(plugin, {}, Invocation("ADD"))
    assert str(err.value) == "CNI plugin plugin ADD failed: netlink: permission denied"


def test_unset_netns_is_absent_from_env() -> None:
    assert "CNI_NETNS" not in Invocation("DEL", netns="").env()
    env = Invocation("ADD", "c", "/run/x", "eth0", "K=V", "/a:/b").env()
    assert (env["CNI_COMMAND"], env["CNI_CONTAINERID"], env["CNI_NETNS"], env["CNI_IFNAME"],
            env["CNI_ARGS"], env["CNI_PATH"]) == ("ADD", "c", "/run/x", "eth0", "K=V", "/a:/b")


@pytest.mark.parametrize(("code", "missing", "status"), [
    (7, False, "FAILED_PRECONDITION"),   # invalid network configuration
    (1, False, "FAILED_PRECONDITION"),   # incompatible CNI version
    (0, True, "FAILED_PRECONDITION"),    # plugin binary not installed
    (11, False, "UNAVAILABLE"),          # try again later
    (999, False, "INTERNAL"),            # the plugin's own failure
])
def test_plugin_error_status(code: int, missing: bool, status: str) -> None:
    err = CNIPluginError("bridge", "ADD", code, "boom", missing=missing)
    assert err.code.name == status and err.cni_code == code
