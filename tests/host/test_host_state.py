"""``agentcompass.host``'s state directories, markers and read-only binds."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from agentcompass.host import (
    HostError,
    SessionExists,
    bind_read_only,
    claim_state_dir,
    read_marker,
    unmount,
    write_marker,
)


def test_a_state_directory_is_claimed_once(tmp_path: Path) -> None:
    root = tmp_path / "state"
    path = claim_state_dir(root, "s1", what="test session")
    assert path == root / "s1" and path.stat().st_mode & 0o777 == 0o700
    (path / "kept").write_text("x")
    with pytest.raises(SessionExists, match="test session 's1' already exists"):
        claim_state_dir(root, "s1", what="test session")
    assert (path / "kept").read_text() == "x"  # nothing of the first one was touched


def test_a_marker_reads_back_and_a_bad_one_reads_as_none(tmp_path: Path) -> None:
    marker = tmp_path / "session.json"
    assert read_marker(marker) == {}
    write_marker(marker, {"name": "s1", "lease": 3})
    assert read_marker(marker) == {"name": "s1", "lease": 3}
    assert not (tmp_path / "session.json.tmp").exists()
    for bad in (b"{torn", b"[1, 2]", json.dumps({"pad": "x" * (1 << 20)}).encode()):
        marker.write_bytes(bad)
        assert read_marker(marker) == {}


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounting needs root")
def test_a_read_only_bind_refuses_writes_and_unmounts(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "f").write_text("host")
    stage, target = tmp_path / "stage", tmp_path / "target"
    with pytest.raises(HostError, match="not a directory"):
        bind_read_only(str(source / "f"), str(stage), str(target))
    bind_read_only(str(source), str(stage), str(target), target_mode=0)
    try:
        assert (target / "f").read_text() == "host"
        for path in (target / "g", stage / "g"):
            with pytest.raises(OSError) as refused:
                path.write_text("agent")
            assert refused.value.errno == errno.EROFS
    finally:
        unmount(str(target))
        unmount(str(stage))
    os.rmdir(target)
    os.rmdir(stage)
    assert (source / "f").read_text() == "host"
    unmount(str(target))  # nothing mounted there (nor any directory) is fine
