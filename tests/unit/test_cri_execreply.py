"""ExecSync's reply built in the output's buffer is byte for byte what protobuf makes."""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.cri.execreply import exec_sync_reply


@pytest.mark.parametrize("out,err,code", [
    (b"", b"", 0), (b"hello\n", b"", 0), (b"", b"oops\n", 1), (b"a" * 200, b"b" * 300, 7),
    (b"x" * (16 * 1024 * 1024 - 1024), b"", 137), (b"out", b"err", -1), (b"o", b"", 2**31 - 1),
])
def test_exec_sync_reply_is_protobufs_serialization(out: bytes, err: bytes, code: int) -> None:
    want = pb.ExecSyncResponse(stdout=out, stderr=err, exit_code=code).SerializeToString()
    buf = bytearray(out)
    reply = exec_sync_reply(buf, bytearray(err), code)
    assert reply is buf  # made in the output's own buffer
    assert bytes(reply) == want
    back = pb.ExecSyncResponse.FromString(bytes(reply))
    assert (back.stdout, back.stderr, back.exit_code) == (out, err, code)
