"""Unpacking image archives into roots: layers, whiteouts, and hostile entries refused."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
import trio
from agentcompass_sandbox import _images, _rootfs

BASE = 1_200_000_000
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unpacking shifts owners: needs root")


def layer(*entries: tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for entry in entries:
            if isinstance(entry, tuple):
                info, data = entry
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(entry)
    return out.getvalue()


def entry(
    name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", uid: int = 0, mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.uid = info.gid = uid
    info.mode = mode
    return info


def archive(path: Path, layers: list[bytes], config: dict[str, object]) -> str:
    """A ``docker save`` tar of ``layers`` with ``config``; its image id."""
    config_bytes = json.dumps({"config": config}).encode()
    digest = hashlib.sha256(config_bytes).hexdigest()
    with tarfile.open(path, "w") as tar:
        names = []
        for i, data in enumerate(layers):
            info = tarfile.TarInfo(f"layer{i}/layer.tar")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            names.append(info.name)
        for name, data in ((f"{digest}.json", config_bytes),):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        manifest = json.dumps([{"Config": f"{digest}.json", "Layers": names}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    return "sha256:" + digest


def unpack(tmp_path: Path, *layers: bytes) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    archive(tmp_path / "image.tar", list(layers), {})
    _rootfs.unpack_archive(str(tmp_path / "image.tar"), str(root), BASE)
    return root


def test_layers_apply_in_order_with_whiteouts_and_shifted_owners(tmp_path: Path) -> None:
    lower = layer(
        entry("etc", tarfile.DIRTYPE, mode=0o755),
        (entry("etc/keep"), b"keep"),
        (entry("etc/gone"), b"gone"),
        entry("opq", tarfile.DIRTYPE, mode=0o755),
        (entry("opq/old"), b"old"),
        (entry("home/user/file", uid=1000), b"mine"),
        (entry("usr/bin/tool", mode=0o4755), b"#!"),
    )
    upper = layer(
        entry("etc/.wh.gone"),
        (entry("opq/new"), b"new"),
        entry("opq/.wh..wh..opq"),
        entry("usr/bin/same", tarfile.LNKTYPE, link="usr/bin/tool"),
    )
    root = unpack(tmp_path, lower, upper)
    assert (root / "etc/keep").read_bytes() == b"keep"
    assert not (root / "etc/gone").exists()
    assert sorted(os.listdir(root / "opq")) == ["new"]  # what this layer made survives its opaque whiteout
    st = (root / "home/user/file").stat()
    assert (st.st_uid, st.st_gid) == (BASE + 1000, BASE + 1000)
    assert (root / "etc/keep").stat().st_uid == BASE
    assert stat.S_IMODE((root / "usr/bin/tool").stat().st_mode) == 0o4755
    assert (root / "usr/bin/same").stat().st_ino == (root / "usr/bin/tool").stat().st_ino
    assert root.stat().st_uid == BASE


def test_nothing_is_written_through_a_symlink_or_outside_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    first = layer(entry("esc", tarfile.SYMTYPE, link=str(outside)), entry("rel", tarfile.SYMTYPE, link="../outside"))
    second = layer((entry("esc/planted"), b"x"), (entry("rel/planted"), b"y"))
    root = unpack(tmp_path, first, second)
    assert os.listdir(outside) == []
    # An upper layer's directory hides the lower layer's link, as an overlay does.
    assert (root / "esc").is_dir() and not (root / "esc").is_symlink()
    assert (root / "esc/planted").read_bytes() == b"x"


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/../evil"])
def test_a_name_leaving_the_root_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(_rootfs.ImageFormatError, match="leaves the root"):
        unpack(tmp_path, layer((entry(name), b"x")))
    assert not (tmp_path / "evil").exists()


def test_device_nodes_are_never_made_and_hard_links_stay_inside(tmp_path: Path) -> None:
    dev = entry("dev/sda", tarfile.BLKTYPE)
    dev.devmajor, dev.devminor = 8, 0
    root = unpack(tmp_path, layer(dev, entry("dev/null", tarfile.CHRTYPE), entry("fifo", tarfile.FIFOTYPE)))
    assert not (root / "dev/sda").exists() and not (root / "dev/null").exists()
    assert stat.S_ISFIFO(os.lstat(root / "fifo").st_mode)
    secret = tmp_path / "secret"
    secret.write_text("host")
    (tmp_path / "x").mkdir()
    with pytest.raises(_rootfs.ImageFormatError, match="leaves the root"):
        unpack(tmp_path / "x", layer(entry("h", tarfile.LNKTYPE, link="../secret")))
    (tmp_path / "y").mkdir()
    first = layer(entry("link", tarfile.SYMTYPE, link=str(secret)))
    second = layer(entry("hard", tarfile.LNKTYPE, link="link"))
    with pytest.raises(_rootfs.ImageFormatError, match="not a regular file"):
        unpack(tmp_path / "y", first, second)


def test_user_is_resolved_by_the_images_own_passwd(tmp_path: Path) -> None:
    root = unpack(
        tmp_path,
        layer(
            (entry("etc/passwd"), b"root:x:0:0::/root:/bin/sh\napp:x:1234:2345::/home/app:/bin/sh\n"),
            (entry("etc/group"), b"root:x:0:\nstaff:x:50:\n"),
        ),
    )
    assert _rootfs.resolve_user(str(root), "app") == (1234, 2345)
    assert _rootfs.resolve_user(str(root), "app:staff") == (1234, 50)
    assert _rootfs.resolve_user(str(root), "77:88") == (77, 88)
    assert _rootfs.resolve_user(str(root), "") == (0, 0)
    with pytest.raises(_rootfs.ImageFormatError):
        _rootfs.resolve_user(str(root), "ghost")


async def test_a_local_archive_is_unpacked_once_and_found_by_digest(tmp_path: Path) -> None:
    path = tmp_path / "image.tar"
    digest = archive(path, [layer((entry("app/hello"), b"hi"))], {"WorkingDir": "/app", "Env": ["A=1", "PATH=/bin"]})
    maker = _images.ImageMaker(_images.RootCache(str(tmp_path / "cache")), host="unix:///nonexistent.sock")
    roots = []
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(lambda: _append(roots, maker.root("t", f"docker-archive:{path}", None)))
    assert {r.digest for r in roots} == {digest}
    assert maker.cache.unpacks == 1
    root = roots[0]
    assert Path(root.rootfs, "app/hello").read_bytes() == b"hi"
    assert (root.workdir, root.env, root.uid) == ("/app", {"A": "1", "PATH": "/bin"}, 0)
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700
    # Held by a session, a root survives a sweep; released, it goes.
    lock = _images.hold(root)
    assert _images.sweep_images(str(tmp_path / "cache"), max_age_seconds=-1) == []
    lock.release()
    assert _images.sweep_images(str(tmp_path / "cache"), max_age_seconds=-1) == [digest]
    assert not Path(root.rootfs).exists()


async def _append(out: list[object], awaitable: object) -> None:
    out.append(await awaitable)  # type: ignore[misc]


async def test_a_reference_without_a_cached_root_and_without_a_daemon_fails_in_one_line(tmp_path: Path) -> None:
    maker = _images.ImageMaker(_images.RootCache(str(tmp_path / "cache")), host=f"unix://{tmp_path}/none.sock")
    with pytest.raises(Exception) as caught:
        await maker.root("t", "busybox:latest", None)
    assert caught.value.code == "image_build_failed"  # type: ignore[attr-defined]
    assert "no Docker-compatible daemon answers" in str(caught.value)


async def test_the_sweep_removes_the_least_recently_used_roots_past_the_size_bound(tmp_path: Path) -> None:
    maker = _images.ImageMaker(_images.RootCache(str(tmp_path / "cache")), host="unix:///nonexistent.sock")
    roots = []
    for name in ("old", "new"):
        path = tmp_path / f"{name}.tar"
        archive(path, [layer((entry(name), b"x" * 100_000))], {"Env": [f"NAME={name}"]})
        roots.append(await maker.root("t", f"docker-archive:{path}", None))
    old, new = roots
    os.utime(Path(old.rootfs).parent / "image.json", (1, 1))  # used long ago
    assert _images.sweep_images(str(tmp_path / "cache"), max_bytes=150_000) == [old.digest]
    assert Path(new.rootfs, "new").exists() and not Path(old.rootfs).exists()
    assert _images.sweep_images(str(tmp_path / "cache"), max_bytes=150_000) == []


async def test_an_oci_layout_with_gzip_layers_is_unpacked_without_a_daemon(tmp_path: Path) -> None:
    import gzip

    layout = tmp_path / "layout"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return "sha256:" + digest

    layers = [blob(gzip.compress(layer((entry("etc/motd"), b"first")))), blob(layer(entry("etc/.wh.motd")))]
    layers.append(blob(gzip.compress(layer((entry("srv/app"), b"app")))))
    config = blob(json.dumps({"config": {"WorkingDir": "/srv", "User": "0:0"}}).encode())
    manifest = {"config": {"digest": config}, "layers": [{"digest": d} for d in layers]}
    (layout / "index.json").write_text(json.dumps({"manifests": [{"digest": blob(json.dumps(manifest).encode())}]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    maker = _images.ImageMaker(_images.RootCache(str(tmp_path / "cache")), host="unix:///nonexistent.sock")
    root = await maker.root("t", f"oci:{layout}", None)
    assert root.digest == config and root.workdir == "/srv"
    assert Path(root.rootfs, "srv/app").read_bytes() == b"app"
    assert not Path(root.rootfs, "etc/motd").exists()
