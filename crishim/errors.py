"""Domain errors. Each carries the kind of failure it is (`code`, a `Kind`), named as the
gRPC status it becomes: crishim.cri.base maps kinds to statuses in one place, so nothing
below the servicers knows about gRPC."""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """What went wrong, from the caller's side (the gRPC code of the same name)."""

    NOT_FOUND = enum.auto()
    INVALID_ARGUMENT = enum.auto()
    ALREADY_EXISTS = enum.auto()
    FAILED_PRECONDITION = enum.auto()
    DEADLINE_EXCEEDED = enum.auto()
    UNAVAILABLE = enum.auto()
    UNAUTHENTICATED = enum.auto()
    PERMISSION_DENIED = enum.auto()
    UNIMPLEMENTED = enum.auto()
    INTERNAL = enum.auto()


class CrishimError(Exception):
    """Base class: the message is shown to the gRPC client, so make it actionable."""

    code: Kind = Kind.INTERNAL


class NotFound(CrishimError):
    code = Kind.NOT_FOUND


class InvalidArgument(CrishimError):
    code = Kind.INVALID_ARGUMENT


class AlreadyExists(CrishimError):
    code = Kind.ALREADY_EXISTS


class FailedPrecondition(CrishimError):
    code = Kind.FAILED_PRECONDITION


class DeadlineExceeded(CrishimError):
    code = Kind.DEADLINE_EXCEEDED


class Unavailable(CrishimError):
    code = Kind.UNAVAILABLE


class Unauthenticated(CrishimError):
    code = Kind.UNAUTHENTICATED


class PermissionDenied(CrishimError):
    code = Kind.PERMISSION_DENIED


class Unimplemented(CrishimError):
    code = Kind.UNIMPLEMENTED


class Internal(CrishimError):
    code = Kind.INTERNAL

