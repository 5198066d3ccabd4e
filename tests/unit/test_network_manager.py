"""NetworkManager against fake CNI plugins: chaining, caching, rollback, DEL replay."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from crishim.config import CNIConfig, Config
from crishim.errors import FailedPrecondition
from crishim.network import manager as manager_mod
from crishim.network.cache import CacheEntry
from crishim.network.invoke import CNIPluginError
from crishim.network.manager import NetworkManager
from crishim.network.types import PodNetwork, PortMapping

# A fake plugin: logs each call (command, env, stdin config) and answers like a CNI plugin.
# Its "ipam" plugin role gives out an IP; chained roles pass prevResult through.
FAKE_PLUGIN = """#!{python}
import json, os, sys
conf = json.load(sys.stdin)
cmd = os.environ["CNI_COMMAND"]
with open(conf["log"], "a") as fh:
    fh.write(json.dumps({{"type": conf["type"], "cmd": cmd, "conf": conf,
        "env": {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}}}) + "\\n")
if cmd in conf.get("fail", []):
    print(json.dumps({{"cniVersion": conf["cniVersion"], "code": 7, "msg": "boom " + cmd,
                      "details": "from " + conf["type"]}}))
    sys.exit(1)
if cmd == "ADD":
    res = conf.get("prevResult") or {{"cniVersion": conf["cniVersion"],
        "interfaces": [{{"name": os.environ["CNI_IFNAME"], "sandbox": os.environ["CNI_NETNS"]}}],
        "ips": [{{"address": "10.9.0.7/24", "interface": 0}}]}}
    res.setdefault("seen", []).append(conf["type"])
    print(json.dumps(res))
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("first", "second", "third"):
        p = bindir / name
        p.write_text(FAKE_PLUGIN.format(python=sys.executable))
        p.chmod(0o755)
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    cfg = Config(root=str(tmp_path / "root"), state=str(tmp_path / "state"),
                 cni=CNIConfig(conf_dir=str(conf_dir), bin_dirs=[str(bindir)]))
    # Unit tests can't pin real namespaces (no root): any existing file counts as pinned.
    monkeypatch.setattr(manager_mod, "is_netns_pinned", os.path.exists)
    netns = tmp_path / "netns-pod"
    netns.write_text("")
    return {"cfg": cfg, "conf_dir": conf_dir, "log": tmp_path / "calls.log",
            "netns": str(netns), "tmp": tmp_path}


def write_net(env: dict[str, Any], plugins: list[dict[str, Any]], name: str = "fake",
              fname: str = "10-fake.conflist", version: str = "1.0.0") -> None:
    for p in plugins:
        p["log"] = str(env["log"])
    (env["conf_dir"] / fname).write_text(
        json.dumps({"cniVersion": version, "name": name, "plugins": plugins}))


def calls(env: dict[str, Any]) -> list[dict[str, Any]]:
    if not env["log"].exists():
        return []
    return [json.loads(line) for line in env["log"].read_text().splitlines()]


POD = PodNetwork(name="web", namespace="prod", uid="uid-1",
                 port_mappings=[PortMapping(80, 8080)])


async def test_not_ready_without_config(env: dict[str, Any]) -> None:
    m = NetworkManager(env["cfg"], lambda: "")
    await m.start()
    ready, reason = await m.status()
    assert not ready and "no network config" in reason
    with pytest.raises(FailedPrecondition, match="network not ready"):
        await m.setup("pod1", env["netns"], POD)
    write_net(env, [{"type": "first"}])
    assert await m.status() == (True, "")  # picked up without a restart
    await m.stop()


async def test_add_chains_results_and_filters_capabilities(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first"},
                    {"type": "second", "capabilities": {"portMappings": True, "ipRanges": True}}])
    m = NetworkManager(env["cfg"], lambda: "10.9.0.0/16")
    res = await m.setup("pod1", env["netns"], POD)
    assert res.ips == ["10.9.0.7"]
    assert res.raw["seen"] == ["first", "second"]
    first, second = calls(env)
    assert first["env"]["CNI_COMMAND"] == "ADD"
    assert first["env"]["CNI_IFNAME"] == "eth0"
    assert first["env"]["CNI_NETNS"] == env["netns"]
    assert first["env"]["CNI_CONTAINERID"] == "pod1"
    assert "K8S_POD_NAME=web" in first["env"]["CNI_ARGS"]
    assert "runtimeConfig" not in first["conf"] and "prevResult" not in first["conf"]
    assert first["conf"]["name"] == "fake" and first["conf"]["cniVersion"] == "1.0.0"
    assert second["conf"]["prevResult"]["seen"] == ["first"]
    assert second["conf"]["runtimeConfig"] == {
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "ipRanges": [[{"subnet": "10.9.0.0/16"}]]}
    assert m.cached_pod_ids() == {"pod1"}
    # A retried setup for the same netns returns the cached attachment without re-ADD.
    again = await m.setup("pod1", env["netns"], POD)
    assert again.ips == ["10.9.0.7"] and len(calls(env)) == 2


async def test_failure_rolls_back_with_plugin_message(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first"}, {"type": "second"}, {"type": "third", "fail": ["ADD"]}])
    m = NetworkManager(env["cfg"], lambda: "")
    with pytest.raises(CNIPluginError) as err:
        await m.setup("pod1", env["netns"], POD)
    assert str(err.value) == "CNI plugin third ADD failed (code 7): boom ADD: from third"
    log = [(c["type"], c["cmd"]) for c in calls(env)]
    assert log == [("first", "ADD"), ("second", "ADD"), ("third", "ADD"),
                   ("third", "DEL"), ("second", "DEL"), ("first", "DEL")]
    # The DELs got the partial result as prevResult, and nothing stays cached.
    assert calls(env)[-1]["conf"]["prevResult"]["seen"] == ["first", "second"]
    assert m.cached_pod_ids() == set()


async def test_failed_rollback_is_kept_for_reconcile(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first", "fail": ["DEL"]}, {"type": "second", "fail": ["ADD"]}])
    m = NetworkManager(env["cfg"], lambda: "")
    with pytest.raises(CNIPluginError, match="second ADD"):
        await m.setup("pod1", env["netns"], POD)
    assert m.cached_pod_ids() == {"pod1"}


async def test_teardown_replays_cached_config_after_config_change(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first"}, {"type": "second", "capabilities": {"portMappings": True}}])
    m = NetworkManager(env["cfg"], lambda: "")
    await m.setup("pod1", env["netns"], POD)
    # The admin switches networks; DEL must still go to the chain that did the ADD.
    (env["conf_dir"] / "10-fake.conflist").unlink()
    write_net(env, [{"type": "third"}], name="other", fname="20-other.conflist")
    os.unlink(env["netns"])  # and the netns is already gone
    env["log"].unlink()
    await m.teardown("pod1", env["netns"])
    dels = calls(env)
    assert [(c["type"], c["cmd"]) for c in dels] == [("second", "DEL"), ("first", "DEL")]
    assert all("CNI_NETNS" not in c["env"] for c in dels)
    assert dels[0]["conf"]["name"] == "fake"
    assert dels[0]["conf"]["prevResult"]["seen"] == ["first", "second"]
    assert dels[0]["conf"]["runtimeConfig"]["portMappings"][0]["hostPort"] == 8080
    assert m.cached_pod_ids() == set()
    await m.teardown("pod1", None)  # idempotent
    await m.teardown("never-existed", None)
    assert len(calls(env)) == 2


async def test_failed_del_keeps_entry_for_retry(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first", "fail": ["DEL"]}])
    m = NetworkManager(env["cfg"], lambda: "")
    await m.setup("pod1", env["netns"], POD)
    with pytest.raises(CNIPluginError, match="boom DEL"):
        await m.teardown("pod1", env["netns"])
    assert m.cached_pod_ids() == {"pod1"}


async def test_reconcile_dels_pods_that_are_not_live(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first"}])
    m = NetworkManager(env["cfg"], lambda: "")
    await m.setup("live", env["netns"], POD)
    await m.setup("dead", env["netns"], POD)
    # A "crash" after the cache write, before ADD finished: no result recorded yet.
    m.cache.write(CacheEntry(pod_id="halfway", network=m.cache.read("dead").network,  # type: ignore[union-attr]
                             cni_args="", runtime_config={}, ifname="eth0", netns=env["netns"]))
    pins = m.netns_dir
    os.makedirs(pins)
    for name in ("live", "orphan"):
        os.close(os.open(os.path.join(pins, name), os.O_CREAT | os.O_WRONLY))
    fresh = NetworkManager(env["cfg"], lambda: "")  # the restarted daemon
    await fresh.reconcile({"live"})
    assert fresh.cached_pod_ids() == {"live"}
    dels = [(c["env"]["CNI_CONTAINERID"], "prevResult" in c["conf"])
            for c in calls(env) if c["cmd"] == "DEL"]
    assert dels == [("dead", True), ("halfway", False)]
    assert sorted(os.listdir(pins)) == ["live"]


async def test_check_runs_chain_with_cached_result(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first"}, {"type": "second"}])
    m = NetworkManager(env["cfg"], lambda: "")
    await m.setup("pod1", env["netns"], POD)
    await m.check("pod1", env["netns"])
    checks = [c for c in calls(env) if c["cmd"] == "CHECK"]
    assert [c["type"] for c in checks] == ["first", "second"]
    assert checks[0]["conf"]["prevResult"]["seen"] == ["first", "second"]


async def test_status_110_network_reports_plugin_status(env: dict[str, Any]) -> None:
    write_net(env, [{"type": "first", "fail": ["STATUS"]}], version="1.1.0")
    m = NetworkManager(env["cfg"], lambda: "")
    await m.start()
    ready, reason = await m.status()
    assert not ready and "boom STATUS" in reason
    await m.stop()
