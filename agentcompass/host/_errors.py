"""The host errors (the tree is drawn in :mod:`agentcompass.host`)."""

from __future__ import annotations


class HostError(RuntimeError):
    """A host command, mount or file operation failed; the message is one line."""


class SessionExists(HostError):
    """A session of that name exists already: nothing was made, nothing is ours to remove."""
