"""ExecSync's reply serialized in the memory that holds the command's stdout.

An ExecSync may return 16 MiB. Built as a message, then serialized, then framed, the
reply would be held two or three times over; here the ExecSyncResponse's wire form is
made in stdout's buffer itself (its field header moved in front, stderr and the exit
code appended), and the server sends that buffer as it is (cri/handlers.py).
"""

from __future__ import annotations

# ExecSyncResponse: stdout = 1, stderr = 2 (length-delimited), exit_code = 3 (varint).
_STDOUT = bytes([1 << 3 | 2])
_STDERR = bytes([2 << 3 | 2])
_EXIT_CODE = bytes([3 << 3 | 0])


def varint(value: int) -> bytes:
    """A protobuf varint; a negative int32 as its 64-bit two's complement, as protobuf."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def exec_sync_reply(stdout: bytearray, stderr: bytes | bytearray, exit_code: int) -> bytearray:
    """The serialized ExecSyncResponse, made in `stdout` (which it consumes): as
    protobuf's own serializer writes it, fields in order, defaults left out."""
    if stdout:
        stdout[0:0] = _STDOUT + varint(len(stdout))  # moved in place, not copied
    if stderr:
        stdout += _STDERR + varint(len(stderr))
        stdout += stderr
    if exit_code:
        stdout += _EXIT_CODE + varint(exit_code)
    return stdout
