"""Images: pull what a task names, build what it ships, each at most once.

A task's ``build_context`` is built under ``agentcompass/<task id>:<hash>``,
the hash covering every file's path, mode and bytes and the image ids the
daemon holds for the Dockerfile's ``FROM`` images, so a changed context or a
rebuilt or retagged base is a new image, and an unchanged one is found by
name on the daemon and reused (by later attempts, requests and runs). A
build's output, without terminal escapes, is kept whole (up to
:data:`MAX_BUILD_LOG_BYTES`) for the attempt's ``logs/build.log``; a failure's
issue carries only its tail. Concurrent opens of one image wait on
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
#: The label every image the provider builds carries (the hash of its context and bases).
CONTEXT_LABEL = "agentcompass.context"
#: How much of one build's output is kept for ``logs/build.log``.
MAX_BUILD_LOG_BYTES = 4 << 20
#: Terminal escapes (CSI, OSC and two-character ones) and carriage returns, dropped from build output.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|\r(?!\n)")
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)


def plain(text: str) -> str:
    """``text`` without terminal escapes (colours, cursor moves, carriage returns)."""
    return _ESCAPES.sub("", text)


def image_failed(message: str, log: str = "", build_log: bytes | None = None) -> IssueError:
    """FATAL ``image_build_failed``: one line, then the log's tail (without
    terminal escapes) on the next lines (diagnostics); ``build_log`` is kept
    as the attempt's ``logs/build.log`` (``IssueError.logs``)."""
    tail = plain(log).rstrip()
    text = message if not tail else f"{message}\n{tail}"
    error = IssueError("fatal", "image_build_failed", text, phase="setup")
    if build_log:
        error.logs = {"build.log": build_log}
    return error


def from_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's ``FROM`` lines name (not its own stages,
    not ``scratch``), in order; one with a build argument is left out."""
    stages: set[str] = set()
    images: list[str] = []
    for match in _FROM.finditer(dockerfile):
        image, stage = match.group(1), match.group(2)
        if image.lower() not in stages and image != "scratch" and "$" not in image and image not in images:
            images.append(image)
        if stage:
            stages.add(stage.lower())
    return images


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
    _contents: dict[tuple[str, str], tuple[str, str]] = attrs.Factory(dict)
    _contexts: dict[tuple[str, str], tuple[str, str, str]] = attrs.Factory(dict)
    #: The output of the builds this provider ran, by tag (for the attempt that ran each).
    build_logs: dict[str, bytes] = attrs.Factory(dict)

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
        """The tag of ``context``'s content alone (hashed once per provider; no
        daemon asked): what a daemonless image cache finds a build by when no
        daemon can name the ids of its ``FROM`` images."""
        digest, _ = await self._context(task_id, context)
        return f"agentcompass/{repository_name(task_id)}:{digest[:20]}"

    async def build_tag(self, task_id: str, context: Path) -> str:
        """The tag :meth:`built` returns: the context and the ids the daemon
        holds now for its ``FROM`` images, so a rebuilt base is a new tag."""
        return (await self._build_key(task_id, context))[0]

    async def _context(self, task_id: str, context: Path) -> tuple[str, str]:
        key = (task_id, os.fspath(context))
        async with self._lock(f"context:{key}"):
            if key not in self._contents:
                try:
                    digest = await trio.to_thread.run_sync(context_tar, context, _Discard())
                    dockerfile = await trio.to_thread.run_sync(_read_dockerfile, context)
                except OSError as exc:
                    raise image_failed(f"reading build context {context}: {exc}") from None
                self._contents[key] = (digest, dockerfile)
            return self._contents[key]

    async def _build_key(self, task_id: str, context: Path) -> tuple[str, str, str]:
        key = (task_id, os.fspath(context))
        digest, dockerfile = await self._context(task_id, context)
        async with self._lock(f"bases:{key}"):
            if key not in self._contexts:
                # The base images as the daemon holds them now: a rebuilt base is a new tag.
                bases = hashlib.sha256(digest.encode())
                for base in from_images(dockerfile):
                    bases.update(f"\0{base}\0{await self._image_id(base)}".encode())
                image_key = bases.hexdigest()
                self._contexts[key] = (f"agentcompass/{repository_name(task_id)}:{image_key[:20]}", digest, image_key)
            return self._contexts[key]

    async def built(self, task_id: str, context: Path) -> str:
        """The tag of ``context``'s image, built here unless the daemon has it."""
        tag, digest, image_key = await self._build_key(task_id, context)
        async with self._lock(tag):
            if tag in self._ready:
                return tag
            try:
                if not await self.exists(tag):
                    await self._build(tag, digest, image_key, context)
            except (EngineError, OSError) as exc:
                raise image_failed(f"building {tag} from {context} failed: {exc}") from None
            self._ready.add(tag)
            return tag

    async def _image_id(self, image: str) -> str:
        """The id the daemon holds for ``image`` ("" when it has none: the build pulls it)."""
        try:
            found = await self.engine.request("GET", f"/images/{image}/json")
        except EngineError as exc:
            if exc.status == 404:
                return ""
            raise
        return str((found or {}).get("Id", ""))

    async def _build(self, tag: str, digest: str, image_key: str, context: Path) -> None:
        self.builds += 1
        spool = await trio.to_thread.run_sync(tempfile.TemporaryFile)
        whole = OutputTail(MAX_BUILD_LOG_BYTES)
        try:
            got = await trio.to_thread.run_sync(context_tar, context, spool)
            if got != digest:
                raise image_failed(f"build context {context} changed while the run used it")
            spool.seek(0)
            log = OutputTail(LOG_TAIL_BYTES)
            errors: list[str] = []
            params = {"t": tag, "rm": True, "forcerm": True, "labels": {CONTEXT_LABEL: image_key}}
            headers = {"Content-Type": "application/x-tar"}

            def line(item: dict[str, Any]) -> None:
                _log_line(item, log, errors)
                _log_line(item, whole, [])

            try:
                async with self.engine.stream(
                    "POST", "/build", params=params, content=_chunks(spool), headers=headers
                ) as r:
                    await read_json_lines(r, line)
            except EngineError as exc:
                raise image_failed(
                    f"building {tag} from {context} failed: {exc}", log.text(), _log_bytes(whole)
                ) from None
            if errors:
                raise image_failed(
                    f"building {tag} from {context} failed: {plain(errors[-1])[:500]}", log.text(), _log_bytes(whole)
                )
            self.build_logs[tag] = _log_bytes(whole)
        finally:
            spool.close()


def _read_dockerfile(context: Path) -> str:
    with open(os.path.join(context, "Dockerfile"), "rb") as f:
        return f.read(1 << 20).decode(errors="replace")


def _log_bytes(log: OutputTail) -> bytes:
    return plain(log.text()).encode()


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
