"""Reading critest's JUnit report: what counts as passed, failed and skipped."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.critest_report import parse_junit

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" failures="1">
  <testsuite name="CRI validation" tests="5">
    <testcase name="[BeforeSuite]" status="passed"></testcase>
    <testcase name="[It] [k8s.io] Streaming should support portforward [Conformance]"
              status="passed"></testcase>
    <testcase name="[It] [k8s.io] Image Manager public image with digest [Conformance]"
              status="failed"><failure message="pull failed">...</failure></testcase>
    <testcase name="[It] [k8s.io] Security Context SELinux should work" status="skipped">
      <skipped message="skipped"></skipped></testcase>
    <testcase name="[AfterSuite]" status="panicked"><error message="boom"></error></testcase>
  </testsuite>
</testsuites>
"""


def test_parse_junit(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    report = parse_junit(str(path))
    assert report.passed == ["[k8s.io] Streaming should support portforward [Conformance]"]
    # A failed suite node counts as a failure too: it may have stopped every spec.
    assert report.failed == ["[k8s.io] Image Manager public image with digest [Conformance]",
                             "[AfterSuite]"]
    assert report.skipped == ["[k8s.io] Security Context SELinux should work"]
    assert report.counts() == "1 of 3 specs passed, 2 failed, 1 skipped"
