"""The verifier's private run under ``docker`` (SPEC 12, docs/docker.md
"Threat model"): where the daemon is on this host, a daemon the agent left
running as root in the container can neither see the verifier's processes
nor touch its tests or reward, while the run keeps the container's own
confinement; elsewhere the fallback is said once in the run's log."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _common import read_json
from _docker_support import provider
from agentcompass_docker import _private

from agentcompass import ComponentRef, ExecutionPlan, NetworkPolicy, SandboxSpec
from agentcompass.testing import hang_guard

FULL = NetworkPolicy("full")
COMPASS = str(Path(sys.executable).with_name("compass"))
# The agent's daemon, root in the container: rewrites the reward and the tests, forever.
PLANTER = """while :; do
  mkdir -p /logs/verifier /tests
  echo 1 > /logs/verifier/reward.txt
  echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh
  sleep 0.01
done
"""
START_PLANTER = "setsid nohup sh /tmp/planter.sh >/dev/null 2>&1 < /dev/null &"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a private run is made from the host by root")


def finding(head: str, tail: str) -> str:
    """A shell loop printing ``/proc/<pid>`` of each process whose command
    line holds ``head + tail``, a string never whole in its own."""
    return (
        f"pat={head}; pat=${{pat}}{tail}; for p in /proc/[0-9]*; do "
        'tr "\\0" " " < $p/cmdline 2>/dev/null | grep -qF "$pat" && echo $p; done; true'
    )


def plan(**sandbox: Any) -> ExecutionPlan:
    return ExecutionPlan("private", 0, ComponentRef("docker", {}), sandbox=SandboxSpec(**sandbox))


async def test_a_daemon_planting_a_reward_and_tests_reaches_neither(docker_daemon: Any) -> None:
    env = provider(docker_daemon)
    with hang_guard(120):
        session = await env.open(env.build_config(plan()), FULL)
        try:
            await session.write_file("/tmp/planter.sh", PLANTER)
            await session.exec(START_PLANTER)
            await session.exec("until [ -s /logs/verifier/reward.txt ]; do sleep 0.01; done")
            result, files = await session.exec_private(
                "cat /tests/test.sh; sh /tests/test.sh; sleep 0.3; ls /logs/verifier",
                directory="/logs/verifier",
                max_bytes=1 << 20,
                inputs={"/tests/test.sh": b"echo 0 > /logs/verifier/reward.txt\n"},
            )
            assert result.exit_code == 0, result
            assert result.stdout == "echo 0 > /logs/verifier/reward.txt\nreward.txt\n"
            assert files == {"reward.txt": b"0\n"}
            assert (await session.exec(finding("planter", ".sh"))).stdout  # it ran throughout
        finally:
            await session.close()


async def test_no_process_of_the_container_sees_the_private_run(docker_daemon: Any) -> None:
    env = provider(docker_daemon)
    marker = secrets.token_hex(8)
    with hang_guard(120):
        session = await env.open(env.build_config(plan()), FULL)
        try:
            seen: list[str] = []

            async def private() -> None:
                # Started: a file on the container's disk; then it lives until the container looked.
                cmd = f"touch /tmp/started-{marker}; exec -a sleeper-{marker} sh -c 'until [ -e /tmp/looked-{marker} ]; do sleep 0.01; done'"
                result, _ = await session.exec_private(cmd, directory="/logs/verifier", max_bytes=1024)
                assert result.exit_code == 0, result

            async with trio.open_nursery() as nursery:
                nursery.start_soon(private)
                await session.exec(f"until [ -e /tmp/started-{marker} ]; do sleep 0.01; done")
                look = await session.exec(f"{finding('sleeper-', marker)}; touch /tmp/looked-{marker}")
                seen = look.stdout.splitlines()
            assert not any(line.startswith("/proc/") for line in seen), seen
        finally:
            await session.close()


async def test_the_private_run_keeps_the_containers_confinement(docker_daemon: Any) -> None:
    env = provider(docker_daemon)
    show = "grep -E '^(Uid|Gid|CapBnd|CapEff|CapInh|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status; cat /proc/self/cgroup; hostname; pwd"
    with hang_guard(120):
        session = await env.open(env.build_config(plan(workdir="/srv")), FULL)
        try:
            plain = await session.exec(show)
            private, _ = await session.exec_private(show, directory="/logs/verifier", max_bytes=1024)
            assert private.exit_code == 0, private
            assert private.stdout == plain.stdout
            assert "Seccomp:\t2" in private.stdout and "NoNewPrivs:\t1" in private.stdout
            # The container's seccomp filters hold: no mount, no new user namespace.
            refused = "unshare -U true 2>/dev/null; echo $?; mount -t tmpfs x /mnt 2>/dev/null; echo $?"
            plain = await session.exec(refused)
            done, _ = await session.exec_private(refused, directory="/logs/verifier", max_bytes=1024)
            assert done.stdout == plain.stdout and "0" not in done.stdout.split(), (done, plain)
        finally:
            await session.close()


async def test_a_timeout_ends_every_process_of_the_private_run(docker_daemon: Any) -> None:
    env = provider(docker_daemon)
    marker = secrets.token_hex(8)
    with hang_guard(120):
        session = await env.open(env.build_config(plan()), FULL)
        try:
            cmd = f"(exec -a left-{marker} sleep 600) & touch /tmp/{marker}; sleep 600"
            result, files = await session.exec_private(cmd, 1.0, directory="/logs/verifier", max_bytes=1024)
            assert result.timed_out and result.exit_code == 124
            assert files == {}
            left = await trio.to_thread.run_sync(_host_processes, f"left-{marker}")
            assert left == []
        finally:
            await session.close()


def _host_processes(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    if needle.encode() in file.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_where_the_containers_process_is_not_this_hosts_there_is_no_private_run() -> None:
    me = os.getpid()
    for info, reason in (
        ({"State": {"Pid": 0}}, "no process"),
        ({"State": {"Pid": me}}, "cgroup does not name it"),
        ({"State": {"Pid": me}, "ProcessLabel": "system_u:system_r:container_t:s0"}, "SELinux"),
    ):
        with pytest.raises(_private.NotLocal, match=reason):
            _private.target("f" * 64, info)


def test_the_cgroup_files_joined_are_the_containers_in_each_hierarchy() -> None:
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "32 25 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
        "33 25 0:29 /docker /mnt/elsewhere rw - cgroup cgroup rw,pids\n"
    )
    cgroup = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n2:name=systemd:/docker/abc\n1:pids:/docker/abc\n5:blkio:/../x\n"
    assert _private.cgroup_procs(cgroup, mountinfo) == [
        "/sys/fs/cgroup/memory/docker/abc/cgroup.procs",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cgroup.procs",
        "/sys/fs/cgroup/systemd/docker/abc/cgroup.procs",
    ]
    unified = "40 25 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert _private.cgroup_procs("0::/system.slice/docker-abc.scope\n", unified) == [
        "/sys/fs/cgroup/system.slice/docker-abc.scope/cgroup.procs"
    ]


def test_the_containers_user_is_resolved_as_docker_resolves_an_execs() -> None:
    passwd = "root:x:0:0:root:/root:/bin/bash\nsvc:x:1001:1002::/home/svc:/bin/sh\n"
    group = "root:x:0:\nsvc:x:1002:\nextra:x:1500:svc,other\n"
    assert _private.account("", passwd, group) == (0, 0, [0], "/root")
    assert _private.account("svc", passwd, group) == (1001, 1002, [1002, 1500], "/home/svc")
    assert _private.account("1001:0", passwd, group) == (1001, 0, [0, 1500], "/home/svc")
    assert _private.account("4242", passwd, group) == (4242, 4242, [4242], "/")
    with pytest.raises(_private.NotLocal, match="nobody"):
        _private.account("nobody", passwd, group)


def test_a_daemon_planted_reward_scores_nothing_on_every_attempt(docker_daemon: Any, tmp_path: Path) -> None:
    """A task whose solution leaves a root daemon rewriting the reward and
    the tests: 0 on 5 of 5 attempts under docker, and no fallback said."""
    task = tmp_path / "tasks" / "daemon-plant"
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 30.0\n')
    (task / "instruction.md").write_text("Make the tests pass.\n")
    (task / "environment" / "Dockerfile").write_text(
        "ARG BASE=agentcompass/base:bookworm\nFROM ${BASE}\nWORKDIR /app\n"
    )
    (task / "solution" / "solve.sh").write_text(
        f"#!/usr/bin/env bash\ncat > /tmp/planter.sh <<'EOF'\n{PLANTER}EOF\n{START_PLANTER}\n"
        "until [ -s /logs/verifier/reward.txt ]; do sleep 0.01; done\n"
    )
    # The planter has ample time to overwrite what the verifier writes.
    (task / "tests" / "test.sh").write_text("#!/usr/bin/env bash\necho 0 > /logs/verifier/reward.txt\nsleep 0.5\n")
    config = {
        "orchestration": {"task_concurrency": 2},
        "requests": [
            {
                "name": "plant",
                "benchmark": {"id": "terminal", "config": {"path": str(tmp_path / "tasks")}},
                "harness": {"id": "oracle"},
                "environment": {"id": "docker", "config": {"host": docker_daemon.host, "pull": "never"}},
                "execution": {"attempts": {"k": 5}},
            }
        ],
    }
    path = tmp_path / "plant.yaml"
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [COMPASS, "launch", str(path), "--output-root", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    [run] = [p.parent for p in (tmp_path / "runs").glob("*/*/run_info.json")]
    [record] = [read_json(p) for p in run.glob("details/*/*.json")]
    attempts = record["attempts"]
    assert len(attempts) == 5
    assert [a["values"].get("reward") for a in attempts] == [0.0] * 5, [a["issues"] for a in attempts]
    assert "verifier_not_private" not in done.stderr + done.stdout


async def test_links_the_agent_made_of_the_directories_neither_fail_nor_redirect_the_run(docker_daemon: Any) -> None:
    env = provider(docker_daemon)
    with hang_guard(120):
        session = await env.open(env.build_config(plan()), FULL)
        try:
            await session.exec(
                "rm -rf /logs /tests; mkdir -p /tmp/l/verifier /tmp/t; ln -s /tmp/l /logs; ln -s /tmp/t /tests"
            )
            result, files = await session.exec_private(
                "sh /tests/test.sh",
                directory="/logs/verifier",
                max_bytes=1024,
                inputs={"/tests/test.sh": b"echo 0 > /logs/verifier/reward.txt\n"},
            )
            assert (result.exit_code, files) == (0, {"reward.txt": b"0\n"}), result
            assert (await session.exec("ls -A /tmp/l/verifier /tmp/t")).stdout.split() == [
                "/tmp/l/verifier:",
                "/tmp/t:",
            ]
        finally:
            await session.close()
