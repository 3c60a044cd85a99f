"""``expose_directory`` and ``expose_socket`` on a running container: the
host's directory is readable and never writable inside (root included), no
session sees another's, a unix socket in it is connectable under policy
``none``, and close, reap and sweep leave no mount or directory behind and
never touch the host's directory. A daemon that does not see this host's
filesystem (a remote one) gives sessions without exposures:
:exc:`NotImplementedError`, everything else working."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from _docker_support import labelled, provider
from agentcompass_docker import _expose

from agentcompass import ComponentRef, ExecutionPlan, IssueError, NetworkPolicy, SandboxSpec
from agentcompass.testing import (
    check_exposed_directory,
    check_exposed_socket,
    check_sweep_detaches_exposures,
    hang_guard,
)

NONE = NetworkPolicy("none")
FULL = NetworkPolicy("full")


def plan(**sandbox) -> ExecutionPlan:
    return ExecutionPlan("expose", 0, ComponentRef("docker", {}), sandbox=SandboxSpec(**sandbox))


def host_dir(tmp_path: Path) -> Path:
    shared = tmp_path / "cache"
    (shared / "sub").mkdir(parents=True)
    (shared / "tool.txt").write_text("from the host\n")
    (shared / "sub" / "run.sh").write_text("echo ran\n")
    os.chmod(shared / "sub" / "run.sh", 0o755)
    os.chmod(tmp_path, 0o755)
    return shared


def leftovers(name: str) -> list[str]:
    """Mounts and state directories of session ``name`` on the host."""
    with open("/proc/self/mountinfo") as f:
        found = [line.split()[4] for line in f if f"/{name}/" in line.split()[4] + "/"]
    if _expose.session_dir(name).exists():
        found.append(str(_expose.session_dir(name)))
    return found


@pytest.mark.parametrize("user", ["root", "nobody"])
async def test_an_exposed_directory_is_readable_never_writable_even_by_root(docker_daemon, tmp_path, user):
    env = provider(docker_daemon)
    await check_exposed_directory(env, env.build_config(plan(user=user)), tmp_path, tag=f"ex{secrets.token_hex(4)}")


async def test_a_session_sees_none_of_another_sessions_exposures_and_nothing_after_close(docker_daemon, tmp_path):
    shared = host_dir(tmp_path)
    env = provider(docker_daemon)
    config = env.build_config(plan(user="root"))
    with hang_guard(60):
        first = await env.open(config, NONE)
        second = await env.open(config, NONE)
        try:
            inside = await first.expose_directory(str(shared))
            again = await first.expose_directory(str(shared))
            assert inside != again
            assert (await second.exec("ls -A /run/agentcompass")).stdout == ""
            assert (await second.exec(f"cat {inside}/tool.txt")).exit_code != 0
            # A process that holds the directory open keeps nothing once the session closes.
            await first.exec(f"cd {inside} && (sleep 600 &) ; true")
        finally:
            await first.close()
        assert leftovers(first.name) == []
        try:
            assert (await second.exec("ls -A /run/agentcompass")).stdout == ""
        finally:
            await second.close()


async def test_an_exposed_socket_is_connectable_under_policy_none(docker_daemon, tmp_path):
    env = provider(docker_daemon)
    await check_exposed_socket(env, env.build_config(plan(user="nobody")), tmp_path, tag=f"es{secrets.token_hex(4)}")


async def test_a_session_under_policy_none_has_loopback_only(docker_daemon):
    # What makes exposing a socket the one way out under policy none.
    env = provider(docker_daemon)
    with hang_guard(60):
        session = await env.open(env.build_config(plan(user="nobody")), NONE)
        try:
            assert (await session.exec("grep -c : /proc/net/dev")).stdout == "1\n"  # lo only
        finally:
            await session.close()


async def test_sweep_after_a_killed_runtime_detaches_everything_and_keeps_the_host_directory(docker_daemon, tmp_path):
    tag = f"ek{secrets.token_hex(4)}"
    env = provider(docker_daemon)
    # A new provider (a new process) sweeps what the killed runtime left.
    await check_sweep_detaches_exposures(
        env, env.build_config(plan()), tmp_path, tag=tag, sweeper=provider(docker_daemon)
    )
    assert leftovers(f"{tag}-w") == [] and labelled(docker_daemon, tag) == []


async def test_reap_after_a_killed_runtime_detaches_everything_and_keeps_the_host_directory(docker_daemon, tmp_path):
    shared = host_dir(tmp_path)
    tag = f"ek{secrets.token_hex(4)}"
    env = provider(docker_daemon)
    with hang_guard(90):
        reaped = await env.open(env.build_config(plan()), FULL, name=f"x{tag}-0")
        try:
            await reaped.expose_directory(str(shared))
            await reaped.expose_socket(str(shared / "tool.txt"))
            # What a runtime killed now leaves; a new provider (a new process) cleans up.
            later = provider(docker_daemon)
            assert leftovers(reaped.name)
            await later.reap(reaped.handle)
            await later.reap(reaped.handle)
            assert leftovers(reaped.name) == [] and labelled(docker_daemon, f"x{tag}") == []
        finally:
            await reaped.close()
    assert sorted(p.name for p in shared.iterdir()) == ["sub", "tool.txt"]


async def test_a_name_in_use_fails_the_open_and_leaves_the_other_session_alone(docker_daemon, tmp_path):
    shared = host_dir(tmp_path)
    env = provider(docker_daemon)
    config = env.build_config(plan())
    name = f"ed{secrets.token_hex(4)}-0"
    with hang_guard(60):
        first = await env.open(config, NONE, name=name)
        try:
            with pytest.raises(IssueError, match="already has a state directory"):
                await env.open(config, NONE, name=name)
            inside = await first.expose_directory(str(shared))
            assert (await first.exec(f"cat {inside}/tool.txt")).stdout == "from the host\n"
            assert sorted(labelled(docker_daemon, name)) == [name, name]
        finally:
            await first.close()
    assert leftovers(name) == []


async def test_without_root_a_session_has_no_exposures_and_says_so(docker_daemon, tmp_path):
    class Unprivileged(type(provider(docker_daemon))):  # type: ignore[misc]
        def host_euid(self) -> int:
            return 1000

    env = Unprivileged(provider(docker_daemon).config)
    with hang_guard(60):
        session = await env.open(env.build_config(plan()), FULL)
        try:
            with pytest.raises(NotImplementedError):
                await session.expose_directory(str(host_dir(tmp_path)))
            assert (await session.exec("ls -A /run/agentcompass")).exit_code != 0
            assert leftovers(session.name) == []
        finally:
            await session.close()


_REMOTE = """
import json, sys, trio
from _docker_support import provider
from agentcompass import NetworkPolicy
from agentcompass_docker import _expose
from test_docker_expose import plan

class Daemon:
    host = sys.argv[1]

async def main():
    env = provider(Daemon)
    session = await env.open(env.build_config(plan()), NetworkPolicy("none"))
    try:
        try:
            await session.expose_directory("/usr")
            exposed = "exposed"
        except NotImplementedError as exc:
            exposed = f"refused: {exc}"
        report = {
            "exposed": exposed,
            "exec": (await session.exec("echo works")).stdout,
            "exposing": env._exposing,
            "state": _expose.session_dir(session.name).exists(),
        }
    finally:
        await session.close()
    print(json.dumps(report))

trio.run(main)
"""


def test_a_daemon_that_does_not_see_the_hosts_files_gives_sessions_without_exposures(docker_daemon):
    # The runtime in a mount namespace of its own whose state root the daemon
    # cannot see: what a remote daemon (or one in another namespace) is like.
    tests = str(Path(__file__).parent)
    mount = f'mount -t tmpfs tmpfs {_expose.STATE_ROOT.parent} && exec "$0" "$@"'
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, sys.executable, "-c", _REMOTE]
        + [docker_daemon.host],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["exposed"].startswith("refused:"), report
    assert report == {"exposed": report["exposed"], "exec": "works\n", "exposing": False, "state": False}
