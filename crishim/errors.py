"""Domain errors. Each carries its gRPC status code (`code`); crishim.cri.base turns them
into statuses in one place."""

from __future__ import annotations

import grpc


class CrishimError(Exception):
    """Base class: the message is shown to the gRPC client, so make it actionable."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class NotFound(CrishimError):
    code = grpc.StatusCode.NOT_FOUND


class InvalidArgument(CrishimError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class AlreadyExists(CrishimError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(CrishimError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class DeadlineExceeded(CrishimError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(CrishimError):
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(CrishimError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(CrishimError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unimplemented(CrishimError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(CrishimError):
    code = grpc.StatusCode.INTERNAL

