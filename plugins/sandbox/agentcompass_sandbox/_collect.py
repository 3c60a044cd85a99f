"""Reading back what a private run left: the regular files under a
directory, through its descriptor, never following a link (blocking)."""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from agentcompass import FileRefusedError
from agentcompass.runtime import read_beneath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def collect(root_fd: int, sub: str, max_bytes: int) -> dict[str, bytes]:
    """Blocking: the regular files under ``sub`` of the directory ``root_fd``
    (relative path -> bytes), in path order, each while it fits in what is
    left of ``max_bytes``; links and special files are skipped and nothing
    is followed."""
    files: dict[str, bytes] = {}
    left = max_bytes
    base = sub.split("/") if sub else []
    try:
        start = _open_beneath(root_fd, base)
    except OSError:
        return files  # the command removed it, or made it a link
    pending: list[tuple[int, str]] = [(start, "")]
    try:
        while pending:
            dir_fd, rel = pending.pop()
            try:
                with os.scandir(dir_fd) as entries:
                    names = sorted(
                        (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in entries
                    )
                subdirs = []
                for name, is_dir, is_file in names:
                    path = f"{rel}{name}"
                    if is_dir:
                        subdirs.append(name)
                    elif is_file:
                        try:
                            data = read_beneath(root_fd, posixpath.join(sub, path) if sub else path, left)
                        except (FileRefusedError, OSError):
                            continue  # larger than what is left, or changed meanwhile
                        files[path] = data
                        left -= len(data)
                for name in reversed(subdirs):
                    try:
                        pending.append((os.open(name, _DIR_FLAGS, dir_fd=dir_fd), f"{rel}{name}/"))
                    except OSError:
                        continue
            finally:
                os.close(dir_fd)
    finally:
        for dir_fd, _ in pending:
            os.close(dir_fd)
    return files


def _open_beneath(root_fd: int, parts: list[str]) -> int:
    fd = os.dup(root_fd)
    try:
        for name in parts:
            next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd
