"""Session file operations that cannot leave a directory (for providers).

A provider that keeps a session's files in host directories reads and writes
them as the runtime's user, often root, while the session's own processes may
change those directories at any instant. Resolving a path and then opening it
is a race: a component swapped for a symbolic link between the two makes the
runtime open a host file. These helpers never resolve and reopen. They walk
the path one component at a time from a descriptor of the session's directory,
each step opened with ``O_NOFOLLOW``, so a link anywhere on the way (or at the
end) is refused, never followed. A read opens with ``O_NONBLOCK``, checks that
it holds a regular file and reads at most ``max_bytes``, so a FIFO, a device or
a 4 GiB sparse file can neither block nor exhaust the runtime. A write goes to a
new file beside the target and is renamed over it, so it never writes through
a hard link or into something the session made.

The root is a path or an open directory descriptor (``int``): a descriptor
reaches a directory that has no path the runtime can name, such as a mount
held only by descriptor, and is neither closed nor moved by them.

They are blocking: call them through ``trio.to_thread.run_sync``. Don't confuse
them with a sandbox: they confine the runtime's own accesses, not the session.
"""

from __future__ import annotations

import errno
import os
import posixpath
import secrets
import stat
from collections.abc import Sequence

from ._errors import FileRefusedError

__all__ = ["DEFAULT_MAX_READ_BYTES", "read_beneath", "split_beneath", "write_beneath"]

#: What ``read_file`` reads at most when the caller names no ``max_bytes``.
DEFAULT_MAX_READ_BYTES = 64 * 1024 * 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1024 * 1024


def split_beneath(relpath: str) -> list[str]:
    """The components of ``relpath`` after lexical normalisation; raise
    :exc:`FileRefusedError` when it is absolute or climbs above its start."""
    if posixpath.isabs(relpath):
        raise FileRefusedError(f"path {relpath!r} is absolute")
    norm = posixpath.normpath(relpath)
    if norm == ".":
        return []
    parts = norm.split("/")
    if parts[0] == "..":
        raise FileRefusedError(f"path {relpath!r} leaves its directory")
    return parts


def _refuse(path: str, exc: OSError) -> OSError:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return FileRefusedError(f"{path!r} is a symbolic link")
    return exc


def _open_dirs(
    root: str | os.PathLike[str] | int, parts: Sequence[str], create: bool, owner: tuple[int, int] | None
) -> int:
    """A new descriptor of the directory ``root/parts...``, walked without following links."""
    try:
        # A descriptor root is reopened, never used itself: the walk closes what it opened.
        fd = os.open(".", _DIR_FLAGS, dir_fd=root) if isinstance(root, int) else os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise _refuse(f"descriptor {root}" if isinstance(root, int) else os.fspath(root), exc) from None
    try:
        for index, name in enumerate(parts):
            try:
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: the open below checks what it is
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                if owner is not None:
                    os.fchown(next_fd, *owner)
            except NotADirectoryError as exc:
                # O_DIRECTORY reports a link as "not a directory": say which it was.
                if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise FileRefusedError(f"{'/'.join(parts[: index + 1])!r} is a symbolic link") from None
                raise exc from None
            except OSError as exc:
                raise _refuse("/".join(parts[: index + 1]), exc) from None
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_beneath(root: str | os.PathLike[str] | int, relpath: str, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``relpath`` under the directory ``root``
    (a path, or an open directory descriptor).

    Raise :exc:`FileNotFoundError` or :exc:`IsADirectoryError` as usual, and
    :exc:`FileRefusedError` for a symbolic link on the way, a file that is
    not regular, or one longer than ``max_bytes`` (default
    :data:`DEFAULT_MAX_READ_BYTES`). Never blocks on what it opens.
    """
    limit = DEFAULT_MAX_READ_BYTES if max_bytes is None else max_bytes
    parts = split_beneath(relpath)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory", relpath)
    dir_fd = _open_dirs(root, parts[:-1], False, None)
    try:
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing elsewhere
                raise FileRefusedError(f"{relpath!r} is not a regular file") from None
            raise _refuse(relpath, exc) from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", relpath)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefusedError(f"{relpath!r} is not a regular file")
        if info.st_size > limit:
            raise FileRefusedError(f"{relpath!r} is larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(_CHUNK, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while being read
                raise FileRefusedError(f"{relpath!r} is larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_beneath(
    root: str | os.PathLike[str] | int,
    relpath: str,
    data: bytes,
    owner: tuple[int, int] | None = None,
    *,
    mode: int | None = None,
) -> None:
    """Replace the file ``relpath`` under the directory ``root`` (a path, or
    an open directory descriptor) with ``data``.

    Missing parent directories are made (owned by ``owner``, a ``(uid, gid)``,
    when given, as is the file). The file's mode is ``mode`` exactly when
    given, else 0o644 less the umask. A symbolic link on the way is refused with
    :exc:`FileRefusedError`; the target itself is replaced by a rename, never
    opened, so a link or FIFO planted there is replaced, not written through.
    """
    parts = split_beneath(relpath)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory", relpath)
    dir_fd = _open_dirs(root, parts[:-1], True, owner)
    try:
        temp = f".{parts[-1][:200]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            try:
                if owner is not None:
                    os.fchown(fd, *owner)
                if mode is not None:
                    os.fchmod(fd, mode)  # after the chown, which clears set-id bits
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.rename(temp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(dir_fd)
