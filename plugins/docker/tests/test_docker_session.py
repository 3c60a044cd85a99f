"""A docker session against a hostile inside: limits, process trees, output
bounds, files the session made, policies switched live, reap and sweep."""

from __future__ import annotations

import secrets

import pytest
import structlog.testing
import trio
from _docker_support import labelled, provider

from agentcompass import ComponentRef, ExecutionPlan, FileRefusedError, NetworkPolicy, SandboxSpec
from agentcompass.testing import hang_guard

FULL = NetworkPolicy("full")
NONE = NetworkPolicy("none")


def plan(**sandbox) -> ExecutionPlan:
    return ExecutionPlan("session", 0, ComponentRef("docker", {}), sandbox=SandboxSpec(**sandbox))


async def opened(daemon, policy: NetworkPolicy = FULL, name: str | None = None, **config):
    env = provider(daemon, **config)
    return env, await env.open(env.build_config(plan()), policy, name=name)


async def test_the_memory_limit_is_enforced(docker_daemon):
    env = provider(docker_daemon)
    with hang_guard(60):
        session = await env.open(env.build_config(plan(memory_mb=32)), FULL)
        try:
            result = await session.exec("x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived ${#x}")
            assert "survived" not in result.stdout
            assert result.exit_code != 0
        finally:
            await session.close()


async def test_a_timeout_kills_a_child_that_left_the_process_group(docker_daemon):
    # With job control, bash puts the background job in a process group of
    # its own: the kill of the exec's session still finds it.
    _, session = await opened(docker_daemon)
    with hang_guard(60):
        try:
            cmd = "set -m; (sleep 1; echo late > /tmp/late) & sleep 30"
            result = await session.exec(cmd, timeout=0.5)
            assert result.timed_out and result.exit_code == 124
            # Until the child would have written (it sleeps 1 s), then a little more.
            await trio.sleep(1.5)
            assert (await session.exec("test -e /tmp/late")).exit_code == 1
        finally:
            await session.close()


async def test_output_past_the_limit_keeps_the_tail_with_a_marker(docker_daemon):
    _, session = await opened(docker_daemon, max_output_bytes=1000)
    with hang_guard(60):
        try:
            result = await session.exec("head -c 5000 /dev/zero | tr '\\0' a; echo END; echo err >&2")
            assert len(result.stdout.encode()) <= 1000
            assert "earlier bytes dropped" in result.stdout and result.stdout.endswith("aEND\n")
            assert result.stderr == "err\n" and result.exit_code == 0
        finally:
            await session.close()


async def test_exec_returns_when_the_command_exits_though_a_daemon_holds_its_output(docker_daemon):
    _, session = await opened(docker_daemon)
    with hang_guard(30):
        try:
            result = await session.exec("sleep 600 & echo $! > /tmp/pid; echo started", timeout=20)
            assert (result.stdout, result.exit_code, result.timed_out) == ("started\n", 0, False)
            assert (await session.exec('kill -0 "$(cat /tmp/pid)"')).exit_code == 0
        finally:
            await session.close()


async def test_read_file_refuses_fifo_link_and_huge_sparse_file_without_blocking(docker_daemon):
    _, session = await opened(docker_daemon)
    with hang_guard(60):
        try:
            made = await session.exec(
                "mkfifo /tmp/fifo && ln -s /etc/shadow /tmp/link && truncate -s 4G /tmp/huge && echo ok > /tmp/small",
                env={},
            )
            assert made.exit_code == 0, made.stderr
            with trio.fail_after(10):
                for path in ("/tmp/fifo", "/tmp/link", "/tmp/huge"):
                    with pytest.raises(FileRefusedError):
                        await session.read_file(path)
            assert await session.read_file("/tmp/small", max_bytes=3) == b"ok\n"
            with pytest.raises(FileNotFoundError):
                await session.read_file("/tmp/absent")
            # write_file replaces a planted link instead of writing through it.
            await session.write_file("/tmp/link", b"replaced")
            assert await session.read_file("/tmp/link") == b"replaced"
            assert (await session.exec("! test -L /tmp/link && grep -q '^root:' /etc/shadow")).exit_code == 0
        finally:
            await session.close()


async def test_the_session_has_no_net_admin_and_no_new_privileges(docker_daemon):
    env = provider(docker_daemon)
    session = await env.open(env.build_config(plan(user="root")), FULL)
    with hang_guard(30):
        try:
            status = (await session.exec("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")).stdout.split()
            effective = int(status[status.index("CapEff:") + 1], 16)
            assert not effective & (1 << 12), "CAP_NET_ADMIN"
            assert not effective & (1 << 13), "CAP_NET_RAW"
            assert not effective & (1 << 21), "CAP_SYS_ADMIN"
            assert status[status.index("NoNewPrivs:") + 1] == "1"
        finally:
            await session.close()


async def test_policies_switch_live_while_a_process_runs(docker_daemon):
    env, session = await opened(docker_daemon, NONE)
    with hang_guard(60):
        try:
            assert (await session.exec("grep -c : /proc/net/dev")).stdout == "1\n"  # lo only
            await session.exec("sleep 600 & echo $! > /tmp/pid")
            # Bring the network up to learn the host's address on it, then listen there.
            await session.set_network_policy(FULL)
            address = session.gateway
            assert address
            with trio.socket.socket() as listener:
                await listener.bind((address, 0))
                listener.listen(16)
                port = listener.getsockname()[1]
                probe = ["bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]
                for policy, reachable in [
                    (NONE, False),
                    (NetworkPolicy("allowlist", (f"{address}:{port}",)), True),
                    (NetworkPolicy("allowlist", (f"{address}:{port + 1}",)), False),
                    (FULL, True),
                    (NONE, False),
                ]:
                    await session.set_network_policy(policy)
                    result = await session.exec(probe, timeout=5)
                    assert (result.exit_code == 0) == reachable, (policy, result)
                    assert (await session.exec('kill -0 "$(cat /tmp/pid)"')).exit_code == 0
        finally:
            await session.close()


async def test_sweep_and_reap_remove_containers_and_networks(docker_daemon):
    tag = f"sw{secrets.token_hex(4)}"
    env = provider(docker_daemon)
    config = env.build_config(plan())
    with hang_guard(90):
        doomed = [await env.open(config, policy, name=f"{tag}-{i}") for i, policy in enumerate((FULL, NONE))]
        other = await env.open(config, FULL, name=f"x{tag}-0")
        try:
            assert sorted(labelled(docker_daemon, tag)) == [f"{tag}-0", f"{tag}-0", f"{tag}-1", f"{tag}-1"]
            await env.sweep(tag)
            assert labelled(docker_daemon, tag) == []
            assert labelled(docker_daemon, f"x{tag}") == [f"x{tag}-0", f"x{tag}-0"]
            await env.sweep(tag)
            handle = other.handle
            await env.reap(handle)
            await env.reap(handle)
            assert labelled(docker_daemon, f"x{tag}") == []
        finally:
            for session in [*doomed, other]:
                await session.close()


async def test_storage_the_daemon_cannot_limit_is_refused_or_run_unlimited_with_one_warning(docker_daemon):
    from structlog.testing import capture_logs

    from agentcompass import IssueError

    strict = provider(docker_daemon, storage="required")
    with hang_guard(120):
        try:
            session = await strict.open(strict.build_config(plan(storage_mb=64)), FULL)
        except IssueError as exc:
            assert (exc.severity, exc.code) == ("fatal", "environment_unsupported")
            assert "cannot limit storage" in exc.message
        else:
            await session.close()
            pytest.skip("this daemon limits storage (overlay2 on xfs with pquota)")
        env = provider(docker_daemon)
        with capture_logs() as logs:
            for _ in range(2):
                session = await env.open(env.build_config(plan(storage_mb=64)), FULL)
                try:
                    assert (await session.exec("echo ran")).stdout == "ran\n"
                finally:
                    await session.close()
        warnings = [entry for entry in logs if entry["event"] == "storage_not_limited"]
        assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
        assert "storage_mb is not enforced" in warnings[0]["message"]


async def test_without_a_private_run_the_run_log_says_so_once(docker_daemon):
    # Local and root here, so sessions run private; the provider's hook is
    # what a remote daemon's session calls, once per exec_private.
    env = provider(docker_daemon)
    with hang_guard(60), structlog.testing.capture_logs() as logs:
        sessions = [await env.open(env.build_config(plan()), FULL) for _ in range(2)]
        try:
            for session in sessions:
                result, files = await session.exec_private(
                    "echo 1 > /logs/verifier/reward.txt", directory="/logs/verifier", max_bytes=1024
                )
                assert (result.exit_code, files) == (0, {"reward.txt": b"1\n"})
            assert [e for e in logs if e["event"] == "verifier_not_private"] == []
            for session in sessions:
                for _ in range(2):
                    session.on_not_private("the daemon is on another host")
        finally:
            for session in sessions:
                await session.close()
    said = [entry for entry in logs if entry["event"] == "verifier_not_private"]
    assert len(said) == 1 and said[0]["log_level"] == "warning", logs
    assert "the daemon is on another host" in said[0]["message"]
