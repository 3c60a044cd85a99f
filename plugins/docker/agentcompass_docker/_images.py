"""Images: pull what a task names, build what it ships, each at most once.

A task's ``build_context`` is built under ``agentcompass/<task id>:<hash>``,
the hash covering every file's path, mode and bytes, so a changed context is
a new image and an unchanged one is found by name on the daemon and reused
(by later attempts, requests and runs). Concurrent opens of one image wait on
one lock per tag: the first builds, the others find it built. The context is
sent as a tar made without following links (links are sent as links, as the
``docker`` CLI does) and bounded in size.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import IO, Any

import attrs
import trio

from agentcompass import IssueError
from agentcompass.runtime import OutputTail

from ._api import Engine, EngineError, read_json_lines

#: The largest build context sent to the daemon.
MAX_CONTEXT_BYTES = 4 << 30
#: How much of a failed build's or pull's log the FATAL issue carries.
LOG_TAIL_BYTES = 4096
#: The label every image the provider builds carries (the context hash).
CONTEXT_LABEL = "agentcompass.context"


def image_failed(message: str, log: str = "") -> IssueError:
    """FATAL ``image_build_failed``: one line, then the log's tail on the next lines (diagnostics)."""
    text = message if not log else f"{message}\n{log.rstrip()}"
    return IssueError("fatal", "image_build_failed", text, phase="setup")


def repository_name(task_id: str) -> str:
    """``task_id`` as a Docker repository path component: lowercase ``[a-z0-9._-]``."""
    name = re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("._-")
    name = re.sub(r"[._-]{2,}", "-", name)
    return (name or "task")[:100]


def split_reference(image: str) -> tuple[str, str]:
    """``(name, tag)`` for a pull: ``busybox`` -> ``(busybox, latest)``; a digest stays in the name."""
    if "@" in image:
        return image, ""
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = image.rsplit(":", 1)
        return name, tag
    return image, "latest"


def context_tar(context: Path, out: Any, limit: int = MAX_CONTEXT_BYTES) -> str:
    """Write ``context`` as an uncompressed tar to ``out`` (blocking) and
    return the hex SHA-256 of its paths, modes and contents.

    Directories are walked without following links; a link is archived as a
    link (the daemon resolves it inside the build, never on this host);
    anything else that is not a regular file or directory is left out.
    Raises :func:`image_failed` past ``limit`` bytes or without a Dockerfile.
    """
    digest = hashlib.sha256()
    total = 0
    root = os.fspath(context)
    if not os.path.isfile(os.path.join(root, "Dockerfile")):
        raise image_failed(f"build context {root} has no Dockerfile")
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for directory, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                full = os.path.join(directory, name)
                rel = os.path.relpath(full, root)
                st = os.lstat(full)
                info = tarfile.TarInfo(rel)
                info.mode = stat.S_IMODE(st.st_mode)
                info.mtime = 0  # the hash, not the clock, says whether it changed
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    digest.update(b"d\0" + rel.encode(errors="surrogateescape") + b"\0")
                elif stat.S_ISLNK(st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(full)
                    tar.addfile(info)
                    digest.update(
                        b"l\0" + rel.encode(errors="surrogateescape") + b"\0" + info.linkname.encode() + b"\0"
                    )
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                    if total > limit:
                        raise image_failed(f"build context {root} is larger than {limit} bytes")
                    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as data:
                        content = _HashingReader(data, digest)
                        digest.update(b"f\0" + rel.encode(errors="surrogateescape") + b"\0" + oct(info.mode).encode())
                        info.size = st.st_size
                        tar.addfile(info, content)
    return digest.hexdigest()


class _Discard(io.RawIOBase):
    """A sink for the tar when only its hash is wanted."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return len(data)


class _HashingReader(io.RawIOBase):
    def __init__(self, raw: IO[bytes], digest: Any):
        self._raw = raw
        self._digest = digest

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._digest.update(data)
        return data


@attrs.define(eq=False)
class ImageCache:
    """Which images this provider has made sure of, and one lock per tag."""

    engine: Engine
    #: How many builds (and pulls) this provider started: what tests and the bench count.
    builds: int = 0
    pulls: int = 0
    _locks: dict[str, trio.Lock] = attrs.Factory(dict)
    _ready: set[str] = attrs.Factory(set)
    _contexts: dict[tuple[str, str], tuple[str, str]] = attrs.Factory(dict)

    async def exists(self, image: str) -> bool:
        try:
            await self.engine.request("GET", f"/images/{image}/json")
        except EngineError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _lock(self, key: str) -> trio.Lock:
        return self._locks.setdefault(key, trio.Lock())

    async def pulled(self, image: str, pull: str) -> str:
        """``image``, pulled per ``pull`` (``always``, ``missing``, ``never``)."""
        async with self._lock(image):
            if image in self._ready and pull != "always":
                return image
            try:
                present = pull != "always" and await self.exists(image)
                if not present:
                    if pull == "never":
                        raise image_failed(f"image {image!r} is not on the daemon and pull is 'never'")
                    await self._pull(image)
            except EngineError as exc:
                raise image_failed(f"pulling {image!r} failed: {exc}") from None
            self._ready.add(image)
            return image

    async def _pull(self, image: str) -> None:
        self.pulls += 1
        name, tag = split_reference(image)
        log = OutputTail(LOG_TAIL_BYTES)
        errors: list[str] = []
        async with self.engine.stream("POST", "/images/create", params={"fromImage": name, "tag": tag or None}) as r:
            await read_json_lines(r, lambda item: _log_line(item, log, errors))
        if errors:
            raise image_failed(f"pulling {image!r} failed: {errors[-1][:500]}", log.text())

    async def context_tag(self, task_id: str, context: Path) -> str:
        """The tag ``context``'s image is built under (its content hashed once
        per provider; no daemon asked): what :meth:`built` returns."""
        return (await self._context(task_id, context))[0]

    async def _context(self, task_id: str, context: Path) -> tuple[str, str]:
        key = (task_id, os.fspath(context))
        async with self._lock(f"context:{key}"):
            if key not in self._contexts:
                try:
                    digest = await trio.to_thread.run_sync(context_tar, context, _Discard())
                except OSError as exc:
                    raise image_failed(f"reading build context {context}: {exc}") from None
                self._contexts[key] = (f"agentcompass/{repository_name(task_id)}:{digest[:20]}", digest)
            return self._contexts[key]

    async def built(self, task_id: str, context: Path) -> str:
        """The tag of ``context``'s image, built here unless the daemon has it."""
        tag, digest = await self._context(task_id, context)
        async with self._lock(tag):
            if tag in self._ready:
                return tag
            try:
                if not await self.exists(tag):
                    await self._build(tag, digest, context)
            except (EngineError, OSError) as exc:
                raise image_failed(f"building {tag} from {context} failed: {exc}") from None
            self._ready.add(tag)
            return tag

    async def _build(self, tag: str, digest: str, context: Path) -> None:
        self.builds += 1
        spool = await trio.to_thread.run_sync(tempfile.TemporaryFile)
        try:
            got = await trio.to_thread.run_sync(context_tar, context, spool)
            if got != digest:
                raise image_failed(f"build context {context} changed while the run used it")
            spool.seek(0)
            log = OutputTail(LOG_TAIL_BYTES)
            errors: list[str] = []
            params = {"t": tag, "rm": True, "forcerm": True, "labels": {CONTEXT_LABEL: digest}}
            headers = {"Content-Type": "application/x-tar"}
            async with self.engine.stream(
                "POST", "/build", params=params, content=_chunks(spool), headers=headers
            ) as r:
                await read_json_lines(r, lambda item: _log_line(item, log, errors))
            if errors:
                raise image_failed(f"building {tag} from {context} failed: {errors[-1][:500]}", log.text())
        finally:
            spool.close()


async def _chunks(spool: IO[bytes]) -> Any:
    while chunk := await trio.to_thread.run_sync(spool.read, 1 << 20):
        yield chunk


def _log_line(item: dict[str, Any], log: OutputTail, errors: list[str]) -> None:
    if "error" in item:
        errors.append(str(item["error"]))
        log.append(f"ERROR: {item['error']}\n".encode())
    elif isinstance(item.get("stream"), str):
        log.append(item["stream"].encode())
    elif isinstance(item.get("status"), str):
        log.append(f"{item['status']} {item.get('progress', '')}".rstrip().encode() + b"\n")
