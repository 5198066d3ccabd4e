"""tests/ci_skips.txt, the only skips CI allows: it parses, each entry names a test that
exists, and only listed node ids match (tests/conftest.py fails any other skip in CI)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import CI_SKIPS, allowed_ci_skips, skip_allowed

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("where", ["v1", "v2"])
def test_every_entry_names_a_test_that_exists(where: str) -> None:
    patterns = allowed_ci_skips(where=where)
    assert patterns, "no entry applies"
    for pattern in patterns:
        path, _, name = pattern.partition("::")
        src = REPO / path
        assert src.is_file(), f"{pattern}: no file {path}"
        func = re.split(r"[\[*]", name, maxsplit=1)[0]
        if func:
            assert re.search(rf"^(async )?def {re.escape(func)}", src.read_text(), re.M), \
                f"{pattern}: no test {func} in {path} (renamed? update tests/ci_skips.txt)"


def test_only_listed_ids_match() -> None:
    v1, v2 = allowed_ci_skips(where="v1"), allowed_ci_skips(where="v2")
    assert skip_allowed("tests/e2e/test_cgroup_v2.py::test_anything", v1)
    assert not skip_allowed("tests/e2e/test_cgroup_v2.py::test_anything", v2)
    assert skip_allowed("tests/kubelet/test_pods.py::test_host_users_false[kubelet-1.32]", v2)
    assert not skip_allowed("tests/kubelet/test_pods.py::test_host_users_false[kubelet-1.36]",
                            v1)
    assert not skip_allowed("tests/e2e/test_foundation.py::test_version", v1 + v2)


def test_a_malformed_entry_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "skips.txt"
    bad.write_text("# fine\nsomewhere tests/x.py::y  # where is not v1, v2 or any\n")
    with pytest.raises(ValueError, match=":2:"):
        allowed_ci_skips(str(bad), "v1")
    assert os.path.isfile(CI_SKIPS)
