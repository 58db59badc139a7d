"""Logging setup for the node: one line per record (time, level, logger, message)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

__all__ = ["setup_logging", "LineFormatter", "LEVELS"]

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
        t = time.gmtime(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"
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


class _MeshdHandler(logging.StreamHandler[TextIO]):
    """Marks the handler we installed, so a second setup replaces it."""


def setup_logging(level: str, stream: TextIO | None = None) -> logging.Handler:
    """Send all logging to `stream` (stderr) at `level` (debug/info/warning/error).

    Idempotent: calling it again replaces the handler it installed before.
    """
    try:
        numeric = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r} (expected one of {', '.join(LEVELS)})") from None
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _MeshdHandler):
            root.removeHandler(h)
    handler = _MeshdHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(LineFormatter())
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _QUIET:
        logging.getLogger(name).setLevel(numeric if numeric == logging.DEBUG else max(numeric, logging.WARNING))
    logging.captureWarnings(True)
    return handler
