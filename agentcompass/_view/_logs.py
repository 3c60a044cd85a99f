"""An attempt's kept logs, as the viewer shows them (SPEC 8, 10).

What the verifier and the agent left in ``/logs`` is kept in the run
directory under ``tasks/<task key>/attempt-<n>/logs/``. The attempt page
lists those files and reads one when asked, addressed by its place in the
sorted listing (a log's name can hold any character; a data path cannot).

Read-only and never led astray: the walk does not follow symbolic links,
only regular files are listed and read, and a file is opened with
``O_NOFOLLOW | O_NONBLOCK``, so a link or FIFO an agent left shows as
nothing rather than as a host file or a hung read. A file longer than
:data:`SHOWN_BYTES` is shown by its last :data:`SHOWN_BYTES`, where a log's
outcome usually is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["SHOWN_BYTES", "list_logs", "read_log"]

#: Bytes of one log file the page shows (its end).
SHOWN_BYTES = 1024 * 1024
#: Files listed per attempt (the store keeps at most 16 MiB of logs per attempt).
MAX_FILES = 2000


def list_logs(logs_dir: Path) -> list[dict[str, Any]]:
    """``[{"path", "size"}]`` of the regular files under ``logs_dir``, by
    path (relative, ``/``-separated); [] when there is no such directory."""
    found: list[tuple[str, int]] = []
    for dirpath, _, filenames in os.walk(logs_dir):  # followlinks=False: links are not entered
        for name in filenames:
            path = Path(dirpath, name)
            try:
                info = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((path.relative_to(logs_dir).as_posix(), info.st_size))
    return [{"path": path, "size": size} for path, size in sorted(found)[:MAX_FILES]]


def read_log(logs_dir: Path, index: int) -> dict[str, Any] | None:
    """The ``index``-th file of :func:`list_logs`: ``{"path", "size",
    "text", "skipped"}``, ``text`` its last :data:`SHOWN_BYTES` decoded as
    UTF-8 (bad bytes replaced), ``skipped`` the bytes before them; None when
    there is no such file, or it is no longer a regular file."""
    files = list_logs(logs_dir)
    if not 0 <= index < len(files):
        return None
    path = files[index]["path"]
    try:
        fd = os.open(logs_dir / path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        skipped = max(0, info.st_size - SHOWN_BYTES)
        f.seek(skipped)
        data = f.read(SHOWN_BYTES)
    return {"path": path, "size": info.st_size, "text": data.decode("utf-8", errors="replace"), "skipped": skipped}
