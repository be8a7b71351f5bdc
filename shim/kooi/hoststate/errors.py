"""The one error of the host-state layer."""

from __future__ import annotations


class HostStateError(Exception):
    """A host description is missing or malformed; the message says what to do."""
