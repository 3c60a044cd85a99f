"""The sandbox directories of ``local``: made with their marker, found by tag, removed marker last so a removal cut short is still recognised."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agentcompass.runtime import IssueError

__all__ = [
    "DIR_PREFIX",
    "MARKER_FILE",
    "SUBDIRS",
    "is_leftover_sandbox",
    "make_sandbox",
    "remove_sandbox",
    "tagged_sandboxes",
]

#: The sandbox subdirectories; each is also a virtual root (``/app`` ...) for file paths.
SUBDIRS = ("app", "tests", "logs", "solution")
#: Created at open; ``reap`` removes only directories that carry it.
MARKER_FILE = ".agentcompass-sandbox"
#: Prefix of every sandbox directory, followed by the session name.
DIR_PREFIX = "agentcompass-local-"


def make_sandbox(root: str | Path | None, name: str) -> str:
    """Blocking: make a sandbox directory (named after the session) with its
    subdirectories and marker."""
    if root is not None:
        os.makedirs(root, exist_ok=True)
    path = os.path.realpath(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{name}-", dir=root))
    try:
        marker = {"provider": "local", "name": name, "pid": os.getpid(), "created": time.time()}
        Path(path, MARKER_FILE).write_text(json.dumps(marker))
        for sub in SUBDIRS:
            os.mkdir(os.path.join(path, sub))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def remove_sandbox(root: str) -> None:
    """Blocking: remove a sandbox directory, the marker last, so that a
    removal cut short can still be recognised (and reaped) later."""
    # Every step tolerates a concurrent removal: a close whose grace ran out
    # leaves its removal running while another close finishes the job.
    try:
        with os.scandir(root) as listing:
            # The entry's type comes with the listing: no stat per entry.
            entries = [(entry.path, entry.is_dir(follow_symlinks=False)) for entry in listing]
    except (FileNotFoundError, NotADirectoryError):
        return
    for path, is_dir in entries:
        if os.path.basename(path) == MARKER_FILE:
            continue
        if is_dir:
            try:
                os.rmdir(path)  # most subdirectories are empty: one call instead of a tree walk
            except FileNotFoundError:
                pass
            except OSError:
                _rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, MARKER_FILE))
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(root)


def _rmtree(path: str) -> None:
    try:
        shutil.rmtree(path, onerror=_unless_missing)
    except OSError:
        # An agent may have left read-only or unreadable directories behind
        # (chmod -R a-rwx); we own them, so grant ourselves access and retry.
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path, 0o700)
        for parent, subdirs, _ in os.walk(path):
            for name in subdirs:
                # Top-down walk: a directory is opened before os.walk descends into it.
                if not os.path.islink(os.path.join(parent, name)):
                    with contextlib.suppress(FileNotFoundError):
                        os.chmod(os.path.join(parent, name), 0o700)
        shutil.rmtree(path, onerror=_unless_missing)


def _unless_missing(function: Any, path: str, exc_info: Any) -> None:
    """rmtree error handler: what another removal already took is fine."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def is_leftover_sandbox(root: str) -> bool:
    """Blocking: whether ``root`` is a sandbox to reap (it carries the marker).
    A missing directory is not; an empty one is what a close cut short left and
    is removed here; anything else without the marker is refused."""
    if not os.path.isdir(root):
        return False
    if os.path.isfile(os.path.join(root, MARKER_FILE)):
        return True
    # A close cut short by a kill removes the marker last but one: an
    # empty directory is what is left of our sandbox, and safe to remove.
    try:
        os.rmdir(root)
        return False
    except OSError:
        pass
    raise IssueError("warning", "cleanup_failed", f"refusing to remove {root}: it is not a local sandbox (no marker)")


def tagged_sandboxes(root: str | Path | None, tag: str) -> set[str]:
    """Blocking: the sandbox directories under ``root`` whose session name
    starts with ``tag`` and carry the marker; a skeleton without the marker
    (made by a process killed between mkdtemp and the marker) is removed here."""
    base = root if root is not None else tempfile.gettempdir()
    prefix = f"{DIR_PREFIX}{tag}"
    try:
        names = [e for e in os.listdir(base) if e.startswith(prefix)]
    except FileNotFoundError:
        names = []
    found = set()
    for entry in names:
        path = os.path.realpath(os.path.join(base, entry))
        if not os.path.isdir(path):
            continue
        if os.path.isfile(os.path.join(path, MARKER_FILE)):
            found.add(path)
            continue
        # Killed between mkdtemp and the marker (or while close removed
        # it): only our own empty skeleton is removed without a marker.
        leftovers = set(os.listdir(path))
        if leftovers <= set(SUBDIRS) and all(not os.listdir(os.path.join(path, d)) for d in leftovers):
            for d in leftovers:
                os.rmdir(os.path.join(path, d))
            os.rmdir(path)
    return found
