"""A session's state directory and its marker."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import SessionExists


def claim_state_dir(root: Path, name: str, mode: int = 0o700, what: str = "session") -> Path:
    """Make ``root/name``, the state directory of session ``name`` (``root``
    too, with ``mode``, when missing) and return it. Raises
    :class:`SessionExists` when it exists already: then nothing was made and
    nothing there is the caller's to remove. ``what`` names the session's
    kind in that message."""
    root.mkdir(mode=mode, parents=True, exist_ok=True)
    path = root / name
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        raise SessionExists(f"{what} {name!r} already exists (its state directory {path} is there)") from None
    return path


#: The most of a marker :func:`read_marker` reads (a larger one reads as none).
_MARKER_BYTES = 1 << 20


def write_marker(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON at ``path``, atomically (a temporary file
    renamed over it): a reader sees the old marker or the new one, never
    half of one. Not fsynced: state directories live on tmpfs and a marker
    lost with the host went with what it described."""
    target = os.fspath(path)
    fd = os.open(target + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, json.dumps(dict(data)).encode())
    finally:
        os.close(fd)
    os.replace(target + ".tmp", target)


def read_marker(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The marker at ``path``; ``{}`` when it is missing, unreadable, larger
    than 1 MiB or not a JSON object (a marker is a hint for
    cleanup, never trusted to exist)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MARKER_BYTES + 1)
        data = json.loads(raw) if len(raw) <= _MARKER_BYTES else None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
