"""critest, the CRI validation suite of cri-tools, against a crishim this test starts:
the whole suite over SPDY, then again with exec, attach and port-forward over WebSocket.

critest is the prebuilt binary in `<repo>/../shared/bin` (not part of this repository).
Its images are the stand-ins of critest_images.py, served by the loopback registry
through hosts.toml mirrors, so nothing is pulled from the internet. Every failed spec
fails the test, except those in ALLOWED_FAILURES, which cannot pass offline.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from tests.e2e.cni import module_network
from tests.e2e.critest_images import push_standins, write_mirrors
from tests.e2e.critest_report import Report, parse_junit
from tests.e2e.daemon import Daemon
from tests.e2e.faults import networked_daemon
from tests.e2e.registry import Registry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRITEST = os.path.join(os.path.dirname(REPO), "shared", "bin", "critest")
WEBSOCKET_FLAGS = ["-websocket-exec", "-websocket-attach", "-websocket-portforward"]
SUITE_TIMEOUT = 900  # one critest run here takes 1-2 minutes

# Specs that cannot pass offline, each with why. Nothing else may fail.
ALLOWED_FAILURES = {
    # Pulls gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9a2...: a digest
    # of upstream's image, which no locally built stand-in can have.
    "[k8s.io] Image Manager public image with digest should be pulled and removed "
    "[Conformance] [Serial]",
}

# critest v1.36's "UserNamespaces" specs: the mapping seen in /proc/self/uid_map (mode
# POD, which needs idmapped mounts on the host, and NODE) and four refused configs. They
# run only for a handler announcing user_namespaces; every one must run and pass here.
USERNS_CONTEXT = " UserNamespaces "
# critest v1.36.0 runs 108 specs; all but the fixed-digest pull (ALLOWED_FAILURES) pass.
MIN_PASSED = 107
USERNS_SPECS = 6



@pytest.fixture(scope="module")
def critest_daemon(registry: Registry) -> Iterator[Daemon]:
    if not os.access(CRITEST, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"CI runs critest, but {CRITEST} is missing")
        pytest.skip(f"critest not found at {CRITEST} (shared/bin beside the repository)")
    push_standins(registry.host)
    with tempfile.TemporaryDirectory(prefix="crishim-critest-certs-") as certs_d:
        write_mirrors(certs_d, registry.host)
        with networked_daemon("crishim-critest", *module_network("critest"),
                              f'[registry]\nconfig_path = "{certs_d}"\n') as nd:
            yield nd.d


def daemon_log(d: Daemon, offset: int = 0) -> str:
    with open(d.log_path, errors="replace") as fh:
        fh.seek(offset)
        return fh.read()


def run_critest(d: Daemon, extra: list[str], label: str,
                capsys: pytest.CaptureFixture[str]) -> tuple[Report, str]:
    """Run the suite; returns its report and what crishim logged meanwhile."""
    junit = os.path.join(d.workdir, f"critest-{label}.xml")
    log_path = os.path.join(d.workdir, f"critest-{label}.log")
    log_offset = os.path.getsize(d.log_path)
    cmd = [CRITEST, "-runtime-endpoint", d.endpoint, "-image-endpoint", d.endpoint,
           *extra, "-ginkgo.no-color", "-ginkgo.junit-report", junit]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.run(cmd, cwd=d.workdir, stdout=log, stderr=subprocess.STDOUT,
                              timeout=SUITE_TIMEOUT, check=False)
    took = time.monotonic() - start
    if not os.path.exists(junit):
        with open(log_path, errors="replace") as fh:
            pytest.fail(f"critest exited {proc.returncode} without a report:\n"
                        f"{fh.read()[-6000:]}")
    report = parse_junit(junit)
    with capsys.disabled():  # the counts show in every run, passed or not
        print(f"\ncritest ({label}): {report.counts()} in {took:.0f}s")
        print(f"  user namespace specs passed: "
              f"{sum(USERNS_CONTEXT in n for n in report.passed)} of {USERNS_SPECS}")
        for name in report.failed:
            allowed = " (allowed offline)" if name in ALLOWED_FAILURES else ""
            print(f"  failed: {name}{allowed}")
    unexpected = [n for n in report.failed if n not in ALLOWED_FAILURES]
    if unexpected:
        with open(log_path, errors="replace") as fh:
            tail = fh.read()[-12000:]
        pytest.fail(f"critest ({label}): {len(unexpected)} unexpected failures: "
                    f"{unexpected}\n{tail}\n--- crishim log ---\n{d.logs()[-4000:]}")
    # A suite that ran fewer specs (a ginkgo focus or skip, a crash half-way) must not pass.
    assert len(report.passed) >= MIN_PASSED, \
        f"critest ({label}) passed {len(report.passed)} specs, expected at least " \
        f"{MIN_PASSED}: {report.counts()}"
    userns = [n for n in report.passed if USERNS_CONTEXT in n]
    skipped = [n for n in report.skipped if USERNS_CONTEXT in n]
    assert len(userns) == USERNS_SPECS and not skipped, \
        f"critest ({label}): user namespace specs passed {userns}, skipped {skipped}"
    return report, daemon_log(d, log_offset)


def test_critest_over_spdy(critest_daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    _, log = run_critest(critest_daemon, [], "spdy", capsys)
    assert "transport=spdy " in log


def test_critest_over_websocket(critest_daemon: Daemon,
                                capsys: pytest.CaptureFixture[str]) -> None:
    _, log = run_critest(critest_daemon, WEBSOCKET_FLAGS, "websocket", capsys)
    # client-go's WebSocket port-forward is SPDY tunnelled in the websocket.
    assert "transport=spdy-over-websocket protocol=portforward.k8s.io" in log
    assert "transport=websocket protocol=v5.channel.k8s.io" in log
