"""``read_beneath`` and ``write_beneath`` rooted at an open directory
descriptor, as at a path: the same walk (no link followed), the descriptor
left open and unmoved, and ``mode`` applied exactly."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcompass.runtime import FileRefusedError, read_beneath, write_beneath

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux file semantics")


@pytest.fixture
def root_fd(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "root").mkdir()
    fd = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def test_a_descriptor_root_reads_and_writes_nested_files_and_stays_open(tmp_path: Path, root_fd: int) -> None:
    before = len(os.listdir("/proc/self/fd"))
    write_beneath(root_fd, "a/b/c.txt", b"\x00nested\xff")
    write_beneath(root_fd, "top.sh", b"echo hi\n", mode=0o755)
    assert read_beneath(root_fd, "a/b/c.txt") == b"\x00nested\xff"
    assert (tmp_path / "root/a/b/c.txt").read_bytes() == b"\x00nested\xff"
    assert stat.S_IMODE((tmp_path / "root/top.sh").stat().st_mode) == 0o755
    assert len(os.listdir("/proc/self/fd")) == before
    os.fstat(root_fd)  # still open: the helpers reopen it, never close it
    with pytest.raises(FileRefusedError, match="larger"):
        read_beneath(root_fd, "top.sh", 3)


def test_the_descriptor_follows_its_directory_not_its_old_path(tmp_path: Path, root_fd: int) -> None:
    (tmp_path / "root").rename(tmp_path / "moved")
    (tmp_path / "root").mkdir()  # what the old path names now is not the root
    write_beneath(root_fd, "x", b"1")
    assert (tmp_path / "moved/x").read_bytes() == b"1"
    assert not (tmp_path / "root/x").exists()


def test_a_link_beneath_a_descriptor_root_is_refused(tmp_path: Path, root_fd: int) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (tmp_path / "root/link").symlink_to(outside)
    (tmp_path / "root/file").symlink_to(outside / "secret")
    with pytest.raises(FileRefusedError, match="symbolic link"):
        read_beneath(root_fd, "link/secret")
    with pytest.raises(FileRefusedError, match="symbolic link"):
        read_beneath(root_fd, "file")
    with pytest.raises(FileRefusedError, match="symbolic link"):
        write_beneath(root_fd, "link/new", b"x")
    with pytest.raises(FileRefusedError, match="leaves"):
        write_beneath(root_fd, "../escape", b"x")
    assert sorted(os.listdir(outside)) == ["secret"]


def test_a_descriptor_that_is_not_a_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"")
    fd = os.open(tmp_path / "plain", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with pytest.raises(NotADirectoryError):
            read_beneath(fd, "x")
    finally:
        os.close(fd)
