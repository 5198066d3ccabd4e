"""One log line per failed call, at the level the failure deserves."""

from __future__ import annotations

import logging

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.base import _fail
from crishim.errors import InvalidArgument, NotFound
from crishim.log import _KVFormatter


def test_a_refused_call_is_one_warning_with_its_ids(caplog: pytest.LogCaptureFixture) -> None:
    req = pb.CreateContainerRequest(pod_sandbox_id="p1",
                                    config=pb.ContainerConfig(
                                        metadata=pb.ContainerMetadata(name="web")))
    with caplog.at_level(logging.DEBUG, logger="crishim.cri"):
        code, message = _fail(InvalidArgument("log_path '/x' must be relative"),
                              "CreateContainer", req)
    assert (code, message) == (grpc.StatusCode.INVALID_ARGUMENT,
                               "log_path '/x' must be relative")
    [record] = caplog.records
    line = _KVFormatter().format(record)
    assert record.levelno == logging.WARNING and not record.exc_info
    for part in ("method=CreateContainer", "pod=p1", "name=web", "code=INVALID_ARGUMENT",
                 "error=\"log_path '/x' must be relative\""):
        assert part in line


def test_not_found_of_an_idempotent_call_is_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="crishim.cri"):
        _fail(NotFound("container c1 not found"), "ContainerStatus",
              pb.ContainerStatusRequest(container_id="c1"))
        _fail(NotFound("pod sandbox p9 does not exist"), "CreateContainer",
              pb.CreateContainerRequest(pod_sandbox_id="p9"))
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.WARNING]


def test_a_bug_is_internal_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="crishim.cri"):
        code, message = _fail(KeyError("x"), "StartContainer",
                              pb.StartContainerRequest(container_id="c2"))
    assert code == grpc.StatusCode.INTERNAL and "StartContainer" in message
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
