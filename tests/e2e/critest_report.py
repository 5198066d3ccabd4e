"""critest's JUnit report (ginkgo's `--junit-report`): which specs passed, failed or were
skipped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field


@dataclass
class Report:
    """The outcome of one critest run, from its JUnit report."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def counts(self) -> str:
        ran = len(self.passed) + len(self.failed)
        return (f"{len(self.passed)} of {ran} specs passed, {len(self.failed)} failed, "
                f"{len(self.skipped)} skipped")


def spec_name(testcase: str) -> str:
    """A spec's name without ginkgo's leaf-node prefix ("[It] ")."""
    return testcase.removeprefix("[It] ")


def parse_junit(path: str) -> Report:
    report = Report()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = spec_name(case.get("name", ""))
        status = case.get("status", "")
        failed = status in ("failed", "panicked", "interrupted", "aborted", "timedout") \
            or case.find("failure") is not None or case.find("error") is not None
        if not name.startswith("[k8s.io]") and not failed:
            continue  # suite set-up nodes ([BeforeSuite]): not specs, unless they failed
        if failed:
            report.failed.append(name)
        elif status == "skipped" or case.find("skipped") is not None:
            report.skipped.append(name)
        else:
            report.passed.append(name)
    return report
