"""Structured logging: one key=value line per event on stderr.

    log = get_logger(__name__)
    log.info("sandbox ready", id=sid, ms=12.3)
    -> ts=… level=info logger=crishim.sandbox msg="sandbox ready" id=… ms=12.3
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR}


def _text(value: object) -> str:
    """A value as a reader wants it: lists as `a,b`, mappings as `k=v,k2=v2`, not as
    Python reprs."""
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return ",".join(_text(v) for v in items)
    if isinstance(value, dict):
        return ",".join(f"{k}:{_text(v)}" for k, v in value.items())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _quote(value: object) -> str:
    s = _text(value)
    if s == "" or any(c in s for c in ' "=\n\t'):
        s = '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


# The active span's (trace id, span id), when tracing is on (set by observe/tracing, which
# sits above this module); None while it is off, so formatting costs one check.
_trace_ids: Callable[[], tuple[str, str] | None] | None = None


def set_trace_ids(source: Callable[[], tuple[str, str] | None] | None) -> None:
    global _trace_ids
    _trace_ids = source


class _KVFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ms = int(record.msecs)
        parts = [f"ts={ts}.{ms:03d}Z", f"level={record.levelname.lower()}",
                 f"logger={record.name}", f"msg={_quote(record.getMessage())}"]
        kv: dict[str, Any] = getattr(record, "kv", {})
        parts.extend(f"{k}={_quote(v)}" for k, v in kv.items())
        if _trace_ids is not None and (ids := _trace_ids()) is not None:
            parts.append(f"trace_id={ids[0]} span_id={ids[1]}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


class Logger:
    """A thin wrapper so that call sites pass fields as keywords."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def _emit(self, level: int, msg: str, exc: bool, kv: dict[str, Any]) -> None:
        if self._log.isEnabledFor(level):
            self._log.log(level, msg, extra={"kv": kv}, exc_info=exc, stacklevel=3)

    def debug(self, msg: str, **kv: Any) -> None:
        self._emit(logging.DEBUG, msg, False, kv)

    def info(self, msg: str, **kv: Any) -> None:
        self._emit(logging.INFO, msg, False, kv)

    def warning(self, msg: str, **kv: Any) -> None:
        self._emit(logging.WARNING, msg, False, kv)

    def error(self, msg: str, **kv: Any) -> None:
        self._emit(logging.ERROR, msg, False, kv)

    def exception(self, msg: str, **kv: Any) -> None:
        self._emit(logging.ERROR, msg, True, kv)


def get_logger(name: str) -> Logger:
    return Logger(name)


def setup(level: str) -> None:
    if level.lower() not in _LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(_LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KVFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level.lower()])
    # grpc's Cython layer logs every loop lookup at debug level: noise, not events.
    logging.getLogger("grpc").setLevel(max(logging.INFO, root.level))
