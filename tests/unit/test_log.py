"""Log lines carry structured values as a reader wants them, never Python reprs."""

from __future__ import annotations

import logging

import pytest

from crishim.log import _KVFormatter, get_logger


def _line(caplog: pytest.LogCaptureFixture, **kv: object) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="crishim.test"):
        get_logger("crishim.test").info("pod ready", **kv)
    return _KVFormatter().format(caplog.records[-1])


def test_lists_sets_and_mappings_are_plain(caplog: pytest.LogCaptureFixture) -> None:
    line = _line(caplog, ips=["10.88.0.2"], both=("10.88.0.2", "fd00::2"),
                 controllers=frozenset({"memory", "cpu"}), labels={"app": "web"},
                 raw=b"ok")
    assert "ips=10.88.0.2 " in line
    assert "both=10.88.0.2,fd00::2 " in line
    assert "controllers=cpu,memory " in line
    assert "labels=app:web " in line
    assert line.endswith("raw=ok")
    assert "[" not in line and "'" not in line


def test_values_with_spaces_stay_quoted(caplog: pytest.LogCaptureFixture) -> None:
    line = _line(caplog, error='bad "x"\nnext', names=["a b", "c"])
    assert 'error="bad \\"x\\"\\nnext"' in line
    assert 'names="a b,c"' in line
