"""Unpacking an image into a root filesystem: hostile input, applied layer by layer.

An image arrives as the tar the Engine API's ``GET /images/{name}/get`` sends
(``docker save``: a ``manifest.json`` naming the config and the layers) or as
an OCI image layout (``index.json``, ``blobs/sha256/...``), as a directory or
a tar of one. Its layers (tar, optionally gzip) are applied in order onto an
empty directory, every name resolved from the root by descriptor, one
component at a time, never following a link (:func:`_parent`): a layer can
make a symlink, but nothing written after it goes through it. Whiteouts
(``.wh.NAME`` removes ``NAME`` from the layers below, ``.wh..wh..opq`` empties
the directory of what the layers below put there) are applied, not copied.
Device nodes are left out (a session has ``/dev`` of its own); a hard link
must name a regular file already unpacked. Owners are shifted by
``uid_base`` (uid ``n`` of the image becomes ``uid_base + n`` on the host,
ids past the map become its ``nobody``), so root in the image is an
unprivileged host uid. Bounded: :data:`MAX_BYTES` of content and
:data:`MAX_ENTRIES` entries per image.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import IO, Any

#: How many ids of the image are mapped (uid and gid 0 to 65535).
ID_COUNT = 65536
_NOBODY = 65534
#: The most content bytes one image may unpack to.
MAX_BYTES = 64 << 30
#: The most entries (files, directories, links) one image may hold.
MAX_ENTRIES = 4_000_000
#: The largest config or manifest read (JSON).
MAX_JSON_BYTES = 16 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


class ImageFormatError(ValueError):
    """The image is malformed or asks for something refused (one line saying what)."""


def clean_name(name: str) -> list[str]:
    """The components of a member name below the root; refuse ``..`` and empty names."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ImageFormatError(f"layer entry {name!r} leaves the root")
    return parts


def _shift(ident: int, base: int) -> int:
    return base + (ident if 0 <= ident < ID_COUNT else _NOBODY)


def _remove(dir_fd: int, name: str) -> None:
    """Remove ``name`` in ``dir_fd`` whatever it is (a directory with its tree), never following a link."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _parent(root_fd: int, parts: list[str], base: int) -> int:
    """A descriptor of the directory holding ``parts[-1]``, walked from the
    root without following links: a component that is not a directory is
    replaced by one (as a directory of an upper layer hides a lower file)."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError, OSError) as exc:
                if not isinstance(exc, FileNotFoundError):
                    _remove(fd, part)
                os.mkdir(part, 0o755, dir_fd=fd)
                os.chown(part, base, base, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def _opened_parent(root_fd: int, parts: list[str], base: int) -> Iterator[int]:
    fd = _parent(root_fd, parts, base)
    try:
        yield fd
    finally:
        os.close(fd)


class _Layer:
    """One layer being applied: what it made, for its opaque whiteouts."""

    def __init__(self, root_fd: int, base: int, budget: list[int]):
        self.root_fd = root_fd
        self.base = base
        self.budget = budget  # [bytes left, entries left], shared by every layer of the image
        self.made: set[str] = set()

    def apply(self, tar: tarfile.TarFile) -> None:
        for member in tar:
            self.budget[1] -= 1
            if self.budget[1] < 0:
                raise ImageFormatError(f"the image has more than {MAX_ENTRIES} entries")
            parts = clean_name(member.name)
            if not parts:
                continue  # the root itself: its attributes are the root's own
            name = parts[-1]
            if name.startswith(_WHITEOUT):
                self._whiteout(parts)
                continue
            path = "/".join(parts)
            with _opened_parent(self.root_fd, parts, self.base) as parent:
                self._member(tar, member, parent, name)
            self.made.add(path)

    def _whiteout(self, parts: list[str]) -> None:
        name = parts[-1]
        directory = "/".join(parts[:-1])
        with _opened_parent(self.root_fd, parts, self.base) as parent:
            if name == _OPAQUE:
                for entry in os.listdir(parent):
                    if posixpath.join(directory, entry) not in self.made:
                        _remove(parent, entry)
            elif name[len(_WHITEOUT) :] not in ("", ".", ".."):
                _remove(parent, name[len(_WHITEOUT) :])

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str) -> None:
        uid, gid = _shift(member.uid, self.base), _shift(member.gid, self.base)
        mode = stat.S_IMODE(member.mode)
        if member.isdir():
            try:
                if not stat.S_ISDIR(os.lstat(name, dir_fd=parent).st_mode):
                    _remove(parent, name)
                    os.mkdir(name, 0o700, dir_fd=parent)
            except FileNotFoundError:
                os.mkdir(name, 0o700, dir_fd=parent)
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
            os.chmod(name, mode, dir_fd=parent)
            return
        if member.isfile():
            self.budget[0] -= member.size
            if self.budget[0] < 0:
                raise ImageFormatError(f"the image unpacks to more than {MAX_BYTES} bytes")
            _remove(parent, name)
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
            )
            with os.fdopen(fd, "wb") as out:
                source = tar.extractfile(member)
                assert source is not None
                shutil.copyfileobj(source, out, 1 << 20)
                os.fchown(out.fileno(), uid, gid)
                os.fchmod(out.fileno(), mode)
            return
        if member.issym():
            _remove(parent, name)
            os.symlink(member.linkname, name, dir_fd=parent)
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
            return
        if member.islnk():
            target = clean_name(member.linkname)
            if not target:
                raise ImageFormatError(f"hard link {member.name!r} names the root")
            with _opened_parent(self.root_fd, target, self.base) as source_dir:
                st = os.lstat(target[-1], dir_fd=source_dir)
                if not stat.S_ISREG(st.st_mode):
                    raise ImageFormatError(f"hard link {member.name!r} names {member.linkname!r}, not a regular file")
                _remove(parent, name)
                os.link(target[-1], name, src_dir_fd=source_dir, dst_dir_fd=parent, follow_symlinks=False)
            return
        if member.isfifo():
            _remove(parent, name)
            os.mkfifo(name, mode, dir_fd=parent)
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
            return
        # Character and block devices (and anything else): never made.


def apply_layer(root: str, layer: IO[bytes], uid_base: int, budget: list[int] | None = None) -> None:
    """Apply one layer (a tar stream, plain or gzip) onto ``root`` (blocking)."""
    root_fd = os.open(root, _DIR)
    try:
        with tarfile.open(fileobj=layer, mode="r|*") as tar:
            _Layer(root_fd, uid_base, budget if budget is not None else [MAX_BYTES, MAX_ENTRIES]).apply(tar)
    except (tarfile.TarError, EOFError) as exc:
        raise ImageFormatError(f"unreadable layer: {exc}") from None
    finally:
        os.close(root_fd)


# ---------------------------------------------------------------- image archives


class _Source:
    """Files of an image archive by name: a directory (OCI layout) or a tar of one."""

    def __init__(self, path: str, stack: ExitStack):
        self._dir = path if os.path.isdir(path) else None
        self._tar: tarfile.TarFile | None = None
        self._members: dict[str, tarfile.TarInfo] = {}
        if self._dir is None:
            self._tar = stack.enter_context(tarfile.open(path, mode="r:"))
            for member in self._tar.getmembers():
                if member.isfile() or member.issym():
                    self._members["/".join(clean_name(member.name))] = member

    def open(self, name: str) -> IO[bytes]:
        parts = clean_name(name)
        if self._dir is not None:
            fd = os.open(self._dir, _DIR)
            try:
                with _walk(fd, parts) as parent:
                    f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            finally:
                os.close(fd)
            return os.fdopen(f, "rb")
        member = self._members.get("/".join(parts))
        for _ in range(8):  # docker save links shared layers to each other
            if member is None or not member.issym():
                break
            target = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
            member = self._members.get("/".join(clean_name(target)))
        if member is None or not member.isfile():
            raise ImageFormatError(f"the image archive has no file {name!r}")
        assert self._tar is not None
        data = self._tar.extractfile(member)
        assert data is not None
        return data

    def has(self, name: str) -> bool:
        try:
            self.open(name).close()
        except (ImageFormatError, OSError):
            return False
        return True

    def json(self, name: str) -> Any:
        with self.open(name) as f:
            data = f.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise ImageFormatError(f"{name} is larger than {MAX_JSON_BYTES} bytes")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ImageFormatError(f"{name} is not JSON: {exc}") from None


@contextmanager
def _walk(root_fd: int, parts: list[str]) -> Iterator[int]:
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _blob(digest: Any) -> str:
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise ImageFormatError(f"not a sha256 digest: {digest!r}")
    return f"blobs/sha256/{digest[7:]}"


def _layout(source: _Source) -> tuple[str, list[str]]:
    """(config file, layer files in order) of the archive."""
    if source.has("manifest.json"):
        manifest = source.json("manifest.json")
        if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
            raise ImageFormatError("manifest.json names no image")
        entry = manifest[0]
        layers = entry.get("Layers")
        if not isinstance(entry.get("Config"), str) or not isinstance(layers, list):
            raise ImageFormatError("manifest.json has no Config or Layers")
        return entry["Config"], [str(layer) for layer in layers]
    index = source.json("index.json")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or not manifests or not isinstance(manifests[0], dict):
        raise ImageFormatError("index.json names no manifest")
    manifest = source.json(_blob(manifests[0].get("digest")))
    if isinstance(manifest, dict) and "manifests" in manifest:  # an index of platforms: the first
        manifest = source.json(_blob(manifest["manifests"][0].get("digest")))
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
        raise ImageFormatError("the OCI manifest has no layers")
    config = _blob((manifest.get("config") or {}).get("digest"))
    return config, [_blob(layer.get("digest")) for layer in manifest["layers"]]


def unpack_archive(archive: str, root: str, uid_base: int) -> dict[str, Any]:
    """Unpack the image in ``archive`` (see the module docstring) into the
    empty directory ``root`` (blocking) and return its config (the
    ``config`` object of the image's config: ``WorkingDir``, ``Env``, ``User``, ...).
    Raises :class:`ImageFormatError` on anything malformed or refused."""
    with ExitStack() as stack:
        source = _Source(archive, stack)
        config_name, layers = _layout(source)
        config = source.json(config_name)
        budget = [MAX_BYTES, MAX_ENTRIES]
        os.chown(root, uid_base, uid_base)
        os.chmod(root, 0o755)
        for layer in layers:
            with source.open(layer) as data:
                apply_layer(root, data, uid_base, budget)
    inner = config.get("config") if isinstance(config, dict) else None
    return inner if isinstance(inner, dict) else {}


def read_in_root(root: str, path: str, limit: int = 1 << 20) -> bytes:
    """A regular file of the unpacked ``root``, walked without following a link
    (``b""`` when it is missing, a link or not a regular file)."""
    parts = clean_name(path)
    fd = os.open(root, _DIR)
    try:
        with _walk(fd, parts) as parent:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
            with os.fdopen(f, "rb") as data:
                if not stat.S_ISREG(os.fstat(data.fileno()).st_mode):
                    return b""
                return data.read(limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def resolve_user(root: str, user: str) -> tuple[int, int]:
    """``USER`` of an image (``name``, ``uid``, ``name:group``, ``uid:gid``) as
    ``(uid, gid)`` by the image's own ``/etc/passwd`` and ``/etc/group``."""
    if not user:
        return 0, 0
    name, _, group = user.partition(":")

    def table(path: str) -> dict[str, list[str]]:
        rows = {}
        for line in read_in_root(root, path).decode(errors="replace").splitlines():
            fields = line.split(":")
            if len(fields) >= 4:
                rows[fields[0]] = fields
        return rows

    passwd = table("etc/passwd")
    if name.isdigit():
        uid = int(name)
        gid = next((int(f[3]) for f in passwd.values() if f[2] == name and f[3].isdigit()), uid)
    elif name in passwd and passwd[name][2].isdigit() and passwd[name][3].isdigit():
        uid, gid = int(passwd[name][2]), int(passwd[name][3])
    else:
        raise ImageFormatError(f"the image's USER {user!r} is not in its /etc/passwd")
    if group:
        groups = table("etc/group")
        if group.isdigit():
            gid = int(group)
        elif group in groups and groups[group][2].isdigit():
            gid = int(groups[group][2])
        else:
            raise ImageFormatError(f"the image's group {group!r} is not in its /etc/group")
    if not (0 <= uid < ID_COUNT and 0 <= gid < ID_COUNT):
        raise ImageFormatError(f"the image's USER {user!r} is outside uid/gid 0-{ID_COUNT - 1}")
    return uid, gid


def archive_digest(archive: str) -> str:
    """The image id of ``archive`` (``sha256:`` of its config's bytes), as a daemon names it."""
    with ExitStack() as stack:
        source = _Source(archive, stack)
        config_name, _ = _layout(source)
        with source.open(config_name) as f:
            data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise ImageFormatError(f"{config_name} is larger than {MAX_JSON_BYTES} bytes")
    return "sha256:" + hashlib.sha256(data).hexdigest()
