"""Image roots: each image unpacked once per content, kept read-only by digest.

Layout of the cache (``image_cache``, mode 0700, root's)::

    roots/<hex digest>/rootfs      the unpacked root (owners shifted by UID_BASE)
    roots/<hex digest>/image.json  its WORKDIR, ENV, USER (resolved to ids)
    refs/<sha256 of the reference>.json   reference -> digest
    locks/<hex digest>.lock        one unpack at a time per digest (flock)
    tmp/                           unpacks under way (swept)

A root is made in ``tmp/`` and renamed into ``roots/`` complete, so a root
that exists is whole. Concurrent attempts, of this process or of other
runtimes, share one unpack: the first takes the digest's lock and unpacks,
the others wait on the lock and find the root made. A session holds a shared
lock on its root's lock file for its lifetime, so :func:`sweep_images` (which
takes it exclusively, without waiting) never removes a root in use.

Where a reference was resolved before, its digest comes from ``refs/``
without asking any daemon: a later run of an unchanged task makes no build,
no export and no unpack. Otherwise the image is pulled or built through a
Docker-compatible daemon (the ``docker`` plugin's client and build cache),
exported (``GET /images/{name}/get``) and unpacked by :mod:`._rootfs`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from agentcompass import IssueError
from agentcompass.host import FileLock

from ._rootfs import ImageFormatError, read_in_root, resolve_user, unpack_archive

#: The host uid (and gid) that uid 0 of every image root maps to; uids
#: ``UID_BASE`` to ``UID_BASE + 65535`` are the images' (no host account has them).
UID_BASE = 1_200_000_000
#: The file a session holds shared while it runs over a root.
LOCK_SUFFIX = ".lock"


def default_cache() -> str:
    """``${XDG_CACHE_HOME:-~/.cache}/agentcompass/images``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "agentcompass", "images")


def image_failed(message: str) -> IssueError:
    return IssueError("fatal", "image_build_failed", message, phase="setup")


@attrs.frozen
class ImageRoot:
    """An unpacked image: ``rootfs`` and what its config says of sessions."""

    digest: str  #: ``sha256:...`` of the image's config (its id)
    rootfs: str
    workdir: str
    env: dict[str, str]
    uid: int
    gid: int
    #: Whether the image's ``/usr/bin/env`` is coreutils' (takes ``-C DIR``):
    #: a command then starts without a shell before it.
    env_chdir: bool = False

    @property
    def lock_path(self) -> str:
        return str(Path(self.rootfs).parent.parent.parent / "locks" / (self.digest[7:] + LOCK_SUFFIX))


def _hex(digest: str) -> str:
    if not digest.startswith("sha256:") or len(digest) != 71 or not all(c in "0123456789abcdef" for c in digest[7:]):
        raise image_failed(f"the daemon gave no sha256 image id: {digest[:80]!r}")
    return digest[7:]


@attrs.define(eq=False)
class RootCache:
    """The cache directory (see the module docstring); blocking methods, called from worker threads."""

    path: str
    #: How many archives this process unpacked (what tests and the bench count).
    unpacks: int = 0

    def _ensure(self) -> Path:
        root = Path(self.path)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # it holds set-id programs of shifted ids: no other host user reaches it
        for sub in ("roots", "refs", "locks", "tmp"):
            (root / sub).mkdir(mode=0o700, exist_ok=True)
        return root

    def ref_file(self, reference: str) -> Path:
        return Path(self.path) / "refs" / (hashlib.sha256(reference.encode()).hexdigest() + ".json")

    def by_reference(self, reference: str) -> ImageRoot | None:
        """The root a reference was resolved to before, if it is still here."""
        try:
            digest = json.loads(self.ref_file(reference).read_text())["digest"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return self.by_digest(digest) if isinstance(digest, str) else None

    def remember(self, reference: str, digest: str) -> None:
        self._ensure()
        target = self.ref_file(reference)
        part = target.with_suffix(f".{secrets.token_hex(4)}.part")
        part.write_text(json.dumps({"reference": reference, "digest": digest}))
        os.replace(part, target)

    def by_digest(self, digest: str) -> ImageRoot | None:
        hexd = _hex(digest)
        directory = Path(self.path) / "roots" / hexd
        try:
            meta = json.loads((directory / "image.json").read_text())
        except (OSError, ValueError):
            return None
        if meta.get("uid_base") != UID_BASE:
            return None
        with contextlib.suppress(OSError):
            os.utime(directory / "image.json")  # last use, for the sweep's age
        return ImageRoot(
            digest=digest,
            rootfs=str(directory / "rootfs"),
            workdir=str(meta.get("workdir") or "/"),
            env=dict(meta.get("env") or {}),
            uid=int(meta.get("uid", 0)),
            gid=int(meta.get("gid", 0)),
            env_chdir=bool(meta.get("env_chdir", False)),
        )

    def spool(self) -> str:
        """A new file in the cache's ``tmp/`` for an archive on its way (the caller removes it)."""
        cache = self._ensure()
        fd, name = tempfile.mkstemp(prefix="export.", suffix=".tar", dir=cache / "tmp")
        os.close(fd)
        return name

    def unpacked(self, digest: str, archive: str) -> ImageRoot:
        """The root of ``digest``, unpacked from ``archive`` (an image archive
        or OCI layout, see :mod:`._rootfs`) unless someone made it already
        (blocking; one unpack per digest across threads and processes)."""
        hexd = _hex(digest)
        cache = self._ensure()
        with FileLock.acquire(cache / "locks" / (hexd + ".unpack")):
            found = self.by_digest(digest)
            if found is not None:
                return found
            work = Path(tempfile.mkdtemp(prefix=f"{hexd[:12]}.", dir=cache / "tmp"))
            try:
                rootfs = work / "rootfs"
                rootfs.mkdir()
                try:
                    config = unpack_archive(archive, str(rootfs), UID_BASE)
                    uid, gid = resolve_user(str(rootfs), str(config.get("User") or ""))
                except ImageFormatError as exc:
                    raise image_failed(f"image {digest[:19]}: {exc}") from None
                env = {}
                for item in config.get("Env") or []:
                    if isinstance(item, str) and "=" in item:
                        key, _, value = item.partition("=")
                        env[key] = value
                meta = {
                    "digest": digest,
                    "workdir": str(config.get("WorkingDir") or "/"),
                    "env": env,
                    "user": str(config.get("User") or ""),
                    "uid": uid,
                    "gid": gid,
                    "uid_base": UID_BASE,
                    "env_chdir": b"chdir" in read_in_root(str(rootfs), "usr/bin/env"),
                    "made": time.time(),
                }
                (work / "image.json").write_text(json.dumps(meta))
                target = cache / "roots" / hexd
                if target.exists():  # made with another uid base: replaced
                    shutil.rmtree(target)
                os.rename(work, target)
                self.unpacks += 1
            finally:
                if work.exists():
                    shutil.rmtree(work, ignore_errors=True)
        found = self.by_digest(digest)
        assert found is not None
        return found


def sweep_images(path: str, max_age_seconds: float | None = None, max_bytes: int | None = None) -> list[str]:
    """Remove image roots unused for ``max_age_seconds``, then the least
    recently used until the cache holds at most ``max_bytes`` (blocking);
    a root a session is running over is never removed. Return the digests removed."""
    cache = Path(path)
    roots = cache / "roots"
    if not roots.is_dir():
        return []
    entries = []
    for directory in roots.iterdir():
        try:
            used = (directory / "image.json").stat().st_mtime
        except OSError:
            used = 0.0
        entries.append((used, directory, _tree_bytes(directory)))
    entries.sort()
    total = sum(size for _, _, size in entries)
    removed = []
    now = time.time()
    for used, directory, size in entries:
        too_old = max_age_seconds is not None and now - used > max_age_seconds
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_big):
            continue
        lock = FileLock.try_acquire(cache / "locks" / (directory.name + LOCK_SUFFIX))
        if lock is None:
            continue  # in use
        with lock:
            shutil.rmtree(directory, ignore_errors=True)
        total -= size
        removed.append("sha256:" + directory.name)
    with contextlib.suppress(FileNotFoundError):
        for stale in (cache / "tmp").iterdir():
            if now - stale.stat().st_mtime > 24 * 3600:
                shutil.rmtree(stale, ignore_errors=True)
    for ref in (cache / "refs").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            digest = json.loads(ref.read_text())["digest"]
            if not (roots / str(digest)[7:]).exists():
                ref.unlink()
    return removed


def _tree_bytes(path: Path) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


def hold(root: ImageRoot) -> FileLock:
    """``root``'s lock, held shared (blocking; the session releases it at
    its end): a sweep leaves the root alone meanwhile. Raise
    ``FileNotFoundError`` when a sweep removed the root before it was held."""
    lock = FileLock.acquire(root.lock_path, 0o600, shared=True)
    try:
        if not os.path.isdir(root.rootfs):
            raise FileNotFoundError(f"the image root {root.rootfs} was swept")
    except BaseException:
        lock.release()
        raise
    return lock


#: References naming an image archive on this host rather than a daemon's image.
LOCAL_PREFIXES = ("oci:", "oci-archive:", "docker-archive:")


@attrs.define(eq=False)
class ImageMaker:
    """Finds or makes the root of a task's image (one per provider instance).

    ``host`` is the Docker-compatible daemon that pulls and builds (asked
    only when the cache has no root for the reference); ``pull`` is the
    ``docker`` provider's policy. A reference starting with ``oci:`` (an
    OCI layout directory), ``oci-archive:`` or ``docker-archive:`` (a tar of
    one, or of ``docker save``) names an archive on this host, unpacked
    without any daemon.
    """

    cache: RootCache
    host: str
    pull: str = "missing"
    #: Where a named image comes from when the cache lacks it: ``daemon``
    #: (pulled by the daemon at ``host``, then exported) or ``registry``
    #: (pulled by :mod:`._registry`, no daemon at all).
    pull_from: str = "daemon"
    _engine: Any = None
    _images: Any = None
    _locks: dict[str, trio.Lock] = attrs.Factory(dict)

    @property
    def builds(self) -> int:
        return 0 if self._images is None else int(self._images.builds)

    def _daemon(self) -> Any:
        if self._images is None:
            try:
                from agentcompass_docker import Engine, ImageCache  # only where a daemon is needed
            except ImportError:
                raise image_failed(
                    "building or pulling an image needs the docker plugin (pip install agentcompass-sandbox[images])"
                ) from None

            self._engine = Engine(self.host)
            self._images = ImageCache(self._engine)
        return self._images

    async def aclose(self) -> None:
        if self._engine is not None:
            engine, self._engine, self._images = self._engine, None, None
            await engine.aclose()

    async def root(self, task_id: str, image: str | None, context: str | None) -> ImageRoot:
        """The root of ``image`` (or of ``context``'s build); FATAL ``image_build_failed`` when it cannot be made."""
        if image is not None and image.startswith(LOCAL_PREFIXES):
            return await self._local(image)
        try:
            if image is not None:
                reference = image
            else:
                assert context is not None
                reference = await self._context_reference(task_id, Path(context))
            if image is None or self.pull != "always":
                found = await trio.to_thread.run_sync(self.cache.by_reference, reference)
                if found is not None:
                    return found
            if image is not None and self.pull_from == "registry":
                return await self._from_registry(image)
            return await self._through_daemon(task_id, reference, image, context)
        except OSError as exc:
            raise image_failed(f"image of task {task_id!r}: {exc}") from None

    async def task_root(
        self, task_id: str, image: str | None, context: str | None, source: str = "prebuilt"
    ) -> tuple[ImageRoot, str | None]:
        """The root of a task that may name both an image and a build
        context, chosen as ``source`` says (``prebuilt``: the image;
        ``build``: the context's build; ``prebuilt_else_build``: the image,
        else, when it cannot be had, the build), and why the build was made
        instead of the image (its first line), else ``None``. FATAL
        ``image_build_failed`` as :meth:`root`."""
        if image is None or context is None:
            return await self.root(task_id, image, context), None
        if source == "build":
            return await self.root(task_id, None, context), None
        try:
            return await self.root(task_id, image, None), None
        except IssueError as exc:
            if source != "prebuilt_else_build" or exc.code != "image_build_failed":
                raise
            reason = exc.message.splitlines()[0]
        return await self.root(task_id, None, context), reason

    async def _through_daemon(self, task_id: str, reference: str, image: str | None, context: str | None) -> ImageRoot:
        images = self._daemon()
        from agentcompass_docker import EngineError

        try:
            if image is not None:
                tag = await images.pulled(image, self.pull)
            else:
                assert context is not None
                tag = await images.built(task_id, Path(context))
            info = await images.engine.request("GET", f"/images/{tag}/json")
            digest = str(info.get("Id", "")) if isinstance(info, dict) else ""
            _hex(digest)
            async with self._locks.setdefault(digest, trio.Lock()):
                found = await trio.to_thread.run_sync(self.cache.by_digest, digest)
                if found is None:
                    found = await self._export_and_unpack(images.engine, tag, digest)
        except EngineError as exc:
            raise image_failed(f"image {reference!r} through the daemon at {self.host}: {exc}") from None
        except httpx.TransportError as exc:
            raise image_failed(
                f"no Docker-compatible daemon answers at {self.host} and {reference!r} is not in the image cache ({exc})"
            ) from None
        await trio.to_thread.run_sync(self.cache.remember, reference, digest)
        if context is not None:  # found by its content alone when no daemon can name its bases
            content = await images.context_tag(task_id, Path(context))
            await trio.to_thread.run_sync(self.cache.remember, content, digest)
        return found

    async def _context_reference(self, task_id: str, context: Path) -> str:
        """The build's tag: its content and its ``FROM`` images' ids where a
        daemon answers (a rebuilt base is a new root), its content alone where none does."""
        images = self._daemon()
        from agentcompass_docker import EngineError

        try:
            return str(await images.build_tag(task_id, context))
        except httpx.TransportError:
            return str(await images.context_tag(task_id, context))
        except EngineError as exc:
            raise image_failed(f"the base images of {context} through the daemon at {self.host}: {exc}") from None

    async def _export_and_unpack(self, engine: Any, tag: str, digest: str) -> ImageRoot:
        spool = await trio.to_thread.run_sync(self.cache.spool)
        try:
            async with await trio.open_file(spool, "wb") as out:
                async with engine.stream("GET", f"/images/{tag}/get") as response:
                    async for chunk in response.aiter_raw():
                        await out.write(chunk)
            return await trio.to_thread.run_sync(self.cache.unpacked, digest, spool, abandon_on_cancel=False)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(spool)

    async def _from_registry(self, image: str) -> ImageRoot:
        if self.pull == "never":
            raise image_failed(f"image {image!r} is not in the image cache and pull is 'never'")
        from ._registry import pull_layout
        from ._rootfs import archive_digest

        work = await trio.to_thread.run_sync(self.cache.spool)
        os.unlink(work)
        try:
            await trio.to_thread.run_sync(pull_layout, image, work, abandon_on_cancel=False)
            digest = await trio.to_thread.run_sync(archive_digest, work)
            root = await trio.to_thread.run_sync(self.cache.unpacked, digest, work, abandon_on_cancel=False)
        except ImageFormatError as exc:
            raise image_failed(f"image {image!r}: {exc}") from None
        except Exception as exc:  # the registry client's own errors (HTTP, connection)
            raise image_failed(f"pulling {image!r} from its registry failed: {exc}") from None
        finally:
            await trio.to_thread.run_sync(shutil.rmtree, work, True)
        await trio.to_thread.run_sync(self.cache.remember, image, digest)
        return root

    async def _local(self, image: str) -> ImageRoot:
        from ._rootfs import archive_digest

        path = image.split(":", 1)[1]
        try:
            digest = await trio.to_thread.run_sync(archive_digest, path)
            return await trio.to_thread.run_sync(self.cache.unpacked, digest, path, abandon_on_cancel=False)
        except (OSError, ImageFormatError) as exc:
            raise image_failed(f"image {image!r}: {exc}") from None
