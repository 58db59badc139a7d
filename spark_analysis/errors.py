"""Errors `meshd report` turns into a one-line message and a non-zero exit."""

from __future__ import annotations


class ReportError(Exception):
    """Base: the report cannot be built from this input."""


class NoTracesError(ReportError):
    """A path (or all of them) holds no trace files or no valid trace lines."""


class SchemaMismatchError(ReportError):
    """The input parses but its fields are not the trace schema."""


class SparkMissingError(ReportError):
    """The optional `spark` extra is not installed."""
