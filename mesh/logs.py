"""Logging setup for the node: one line per record (time, level, logger, message),
as text or (`log_format = "json"`) as one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

from oplog import EVENT_ATTR, FIELDS_ATTR

__all__ = ["setup_logging", "LineFormatter", "JsonFormatter", "LEVELS", "FORMATS"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# Chatty third-party loggers stay at WARNING unless the node runs at debug.
_QUIET = ("zeroconf", "hpack", "h11", "trio_websocket")


class LineFormatter(logging.Formatter):
    """`2026-11-22T02:18:21.123Z INFO mesh.broker: message`.

    Newlines inside the message are escaped so one record is one line and log
    tools can split on newlines; a traceback follows on indented lines.
    """

    def format(self, record: logging.LogRecord) -> str:
        stamp = _stamp(record)
        message = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        line = f"{stamp} {record.levelname} {record.name}: {message}"
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + "\n".join("  " + part for part in record.exc_text.splitlines())
        if record.stack_info:
            line += "\n" + "\n".join("  " + part for part in record.stack_info.splitlines())
        return line


def _stamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """`{"ts": ..., "level": "INFO", "logger": "meshd.client", "event": "client.connected", "client_id": "c1", ...}`.

    An operator event (`oplog.log_event`) gives its event name and fields as keys;
    any other record gives its text as `msg` (and a traceback as `exc`).
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {"ts": _stamp(record), "level": record.levelname, "logger": record.name}
        event = getattr(record, EVENT_ATTR, None)
        if event is not None:
            out["event"] = event
            fields = getattr(record, FIELDS_ATTR, {})
            # A field never hides the line's own keys.
            out.update({k: v for k, v in fields.items() if k not in out})
        else:
            out["msg"] = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str)


FORMATS: dict[str, type[logging.Formatter]] = {"text": LineFormatter, "json": JsonFormatter}


class _MeshdHandler(logging.StreamHandler[TextIO]):
    """Marks the handler we installed, so a second setup replaces it."""


def setup_logging(level: str, stream: TextIO | None = None, log_format: str = "text") -> logging.Handler:
    """Send all logging to `stream` (stderr) at `level` (debug/info/warning/error),
    as text lines or JSON lines (`log_format`).

    Idempotent: calling it again replaces the handler it installed before.
    """
    try:
        numeric = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r} (expected one of {', '.join(LEVELS)})") from None
    try:
        formatter = FORMATS[log_format.lower()]()
    except KeyError:
        raise ValueError(f"unknown log format {log_format!r} (expected one of {', '.join(FORMATS)})") from None
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _MeshdHandler):
            root.removeHandler(h)
    handler = _MeshdHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _QUIET:
        logging.getLogger(name).setLevel(numeric if numeric == logging.DEBUG else max(numeric, logging.WARNING))
    logging.captureWarnings(True)
    return handler
