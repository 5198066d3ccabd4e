"""The kubelet scenario's pure parts: the pod, the block schedule, the running check."""

from __future__ import annotations

from hack.benchlib.kubelet import all_running, bench_pod, schedule


def test_schedule_alternates_blocks_and_gives_every_runtime_its_rounds() -> None:
    assert schedule(["a", "b"], 5, 2) == [("a", 3), ("b", 3), ("a", 2), ("b", 2)]
    assert schedule(["a", "b", "c"], 3, 1) == [("a", 3), ("b", 3), ("c", 3)]
    # More blocks than rounds: one round per block.
    assert schedule(["a"], 2, 5) == [("a", 1), ("a", 1)]
    plan = schedule(["a", "b", "c"], 10, 2)
    assert all(sum(n for r, n in plan if r == rt) == 10 for rt in "abc")


def test_bench_pod_is_realistic() -> None:
    pod = bench_pod("bench-0-1", "reg/busybox:bench")
    assert pod["metadata"]["name"] == "bench-0-1"
    ctrs = pod["spec"]["containers"]
    assert [c["name"] for c in ctrs] == ["web", "sidecar"]
    for c in ctrs:
        assert c["image"] == "reg/busybox:bench"
        assert c["resources"]["limits"] == {"cpu": "100m", "memory": "32Mi"}
        assert c["readinessProbe"]["periodSeconds"] == 1
        assert "trap 'exit 0' TERM" in c["command"][2]  # stops without the grace period
    assert "httpGet" in ctrs[0]["readinessProbe"] and "exec" in ctrs[1]["readinessProbe"]


def test_all_running_needs_every_container_running() -> None:
    def pod(*states: str) -> dict[str, object]:
        return {"status": {"containerStatuses": [{"state": {s: {}}} for s in states]}}

    assert all_running(pod("running", "running"))
    assert not all_running(pod("running", "waiting"))
    assert not all_running({"status": {}})
