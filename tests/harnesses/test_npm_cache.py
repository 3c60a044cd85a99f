"""npm entries of the agent cache, built with the host's real npm from a
package tarball made on the spot (no registry): the package is installed
under ``npm/``, ``bin/`` links to its native executable, the entry is
world-readable and complete only with ``installed.json``; a package without
the executable, or no npm, is FATAL ``agent_install_failed`` and leaves no
entry behind."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest
import trio

from agentcompass import IssueError
from agentcompass.harnesses._agent_cache import CacheEntry, ensure_installed

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")


def _tarball(directory: Path, name: str, version: str) -> Path:
    """An npm package tarball holding ``native/tool`` (a script standing in for a native executable)."""
    path = directory / f"{name}-{version}.tgz"
    files = {
        "package/package.json": (json.dumps({"name": name, "version": version}).encode(), 0o644),
        "package/native/tool": (f"#!/bin/sh\necho {name} {version}\n".encode(), 0o755),
    }
    with tarfile.open(path, "w:gz") as archive:
        for member, (data, mode) in files.items():
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), mode
            archive.addfile(info, io.BytesIO(data))
    return path


async def test_an_npm_entry_links_its_native_executable_and_is_world_readable(tmp_path):
    package = _tarball(tmp_path, "fake-agent", "1.2.3")
    root = tmp_path / "cache"
    binaries = {"tool": ["fake-agent-other-platform/tool", "fake-agent/native/tool"]}

    async def build() -> CacheEntry:
        return await ensure_installed("fake-1.2.3", [str(package)], root=root, installer="npm", binaries=binaries)

    entry = await build()
    assert entry.built is True and entry.install_seconds > 0
    link = entry.path / "bin" / "tool"
    assert os.readlink(link) == "../npm/node_modules/fake-agent/native/tool"  # relative: valid wherever it is mounted
    assert (await trio.run_process([str(link)], capture_stdout=True)).stdout == b"fake-agent 1.2.3\n"
    info = json.loads((entry.path / "installed.json").read_text())
    assert info["binaries"] == {"tool": "fake-agent/native/tool"}
    for parent, dirs, files in os.walk(entry.path):
        for name in dirs + files:
            mode = os.lstat(os.path.join(parent, name)).st_mode
            if not stat.S_ISLNK(mode):
                assert mode & 0o004, os.path.join(parent, name)
    again = await build()
    assert again.built is False and again.path == entry.path


async def test_concurrent_builds_of_one_npm_entry_share_one_install(tmp_path):
    package = _tarball(tmp_path, "fake-agent", "2.0.0")
    root = tmp_path / "cache"
    built = []

    async def build() -> None:
        entry = await ensure_installed(
            "fake-2.0.0", [str(package)], root=root, installer="npm", binaries={"tool": ["fake-agent/native/tool"]}
        )
        built.append(entry.built)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(build)
    assert sorted(built) == [False, False, True]


async def test_a_package_without_the_executable_is_fatal_and_leaves_no_entry(tmp_path):
    package = _tarball(tmp_path, "fake-agent", "3.0.0")
    root = tmp_path / "cache"
    with pytest.raises(IssueError) as caught:
        await ensure_installed(
            "fake-3.0.0", [str(package)], root=root, installer="npm", binaries={"tool": ["fake-agent-linux-x64/tool"]}
        )
    assert caught.value.code == "agent_install_failed" and caught.value.severity == "fatal"
    assert "no executable 'tool' for this platform" in caught.value.message
    assert not (root / "fake-3.0.0" / "installed.json").exists()


async def test_a_failing_or_missing_npm_is_fatal_agent_install_failed(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    with pytest.raises(IssueError) as caught:
        await ensure_installed("gone-1", [str(tmp_path / "no-such.tgz")], root=root, installer="npm", binaries={})
    assert caught.value.code == "agent_install_failed" and "no-such.tgz" in caught.value.message
    monkeypatch.setenv("AGENTCOMPASS_AGENT_NPM", str(tmp_path / "no-npm"))
    with pytest.raises(IssueError) as caught:
        await ensure_installed("gone-2", ["x@1"], root=root, installer="npm", binaries={})
    assert caught.value.code == "agent_install_failed" and "no-npm" in caught.value.message
    assert sorted(p.name for p in root.iterdir() if (p / "installed.json").exists()) == []


async def test_an_npm_agent_whose_executable_does_not_run_in_the_session_is_environment_unsupported(
    tmp_path, monkeypatch
):
    try:
        from agentcompass_sandbox import host_problem
    except ImportError:
        pytest.skip("the sandbox plugin is not installed")
    if host_problem() is not None:
        pytest.skip(host_problem())
    from _installed_support import details, launch

    from agentcompass.agents import AgentRun, InstalledAgent, register_agent
    from agentcompass.testing.model_server import ModelServer, episode, text

    # The "native" executable needs an interpreter only the host has (the sandbox has a /tmp of its own).
    private = tmp_path / "host-only"
    private.mkdir()
    os.symlink("/bin/sh", private / "sh")
    package = tmp_path / "fake-agent-9.9.9.tgz"
    with tarfile.open(package, "w:gz") as archive:
        for member, data, mode in (
            ("package/package.json", json.dumps({"name": "fake-agent", "version": "9.9.9"}).encode(), 0o644),
            ("package/native/tool", f"#!{private}/sh\necho hi\n".encode(), 0o755),
        ):
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), mode
            archive.addfile(info, io.BytesIO(data))

    @register_agent
    class HostOnlyAgent(InstalledAgent):
        id = "host-only-npm-agent"
        distribution = "fake-agent"
        version = "9.9.9"
        installer = "npm"

        def requirements(self, version: str) -> list[str]:
            return [str(package)]

        def binaries(self) -> dict[str, list[str]]:
            return {"tool": ["fake-agent/native/tool"]}

        def command(self, run: AgentRun) -> str:
            return run.binary("tool")

    monkeypatch.setenv("AGENTCOMPASS_AGENT_CACHE", str(tmp_path / "cache"))
    server = ModelServer(episode([text("never")]))
    result, run_dir = await launch(tmp_path, server, {"agent": "host-only-npm-agent"}, tasks=["hello-file"])
    (record,) = details(run_dir).values()
    issues = record["attempts"][0]["issues"]
    assert [(i["severity"], i["code"], i["phase"]) for i in issues] == [("fatal", "environment_unsupported", "setup")]
    assert "host-only-npm-agent" in issues[0]["message"] and "/bin/tool did not" in issues[0]["message"]
    assert server.requests == []
