"""A journal line for fakes whose calls run in other processes."""

from __future__ import annotations

import os

__all__ = ["append_line"]


def append_line(path: str, line: str) -> None:
    """Append ``line`` and a newline to the file at ``path`` in one ``O_APPEND``
    write, so the lines of concurrent processes never interleave.

    A test's own components use it to tell the test what they did when they
    run outside the test's process (a ``compass`` subprocess, a worker of the
    ``ray`` executor), where a :class:`CallLog` cannot reach: the test reads
    the file afterwards, one event per line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
