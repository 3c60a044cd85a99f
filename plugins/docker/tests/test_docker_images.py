"""Images: built once per content and shared, reused by a later provider,
pulled per ``pull``, and a failed or slow build reported as SPEC 10 says."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio
from _docker_support import provider

from agentcompass import ComponentRef, ExecutionPlan, IssueError, NetworkPolicy, SandboxSpec
from agentcompass.testing import hang_guard

FULL = NetworkPolicy("full")


def plan(task_id: str, **sandbox) -> ExecutionPlan:
    return ExecutionPlan(task_id, 0, ComponentRef("docker", {}), sandbox=SandboxSpec(**sandbox))


def context(tmp_path: Path, dockerfile: str, **files: str) -> Path:
    directory = tmp_path / "environment"
    directory.mkdir(exist_ok=True)
    (directory / "Dockerfile").write_text(dockerfile)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


async def test_a_context_is_built_once_shared_by_concurrent_opens_and_reused(docker_daemon, tmp_path: Path):
    ctx = context(
        tmp_path,
        "FROM agentcompass/base:bookworm\nCOPY state.txt /opt/state.txt\nRUN echo built > /opt/built\nWORKDIR /srv\n",
        **{"state.txt": f"content {tmp_path.name}\n"},
    )
    env = provider(docker_daemon)
    config = env.build_config(plan("Build/Once_1", build_context=ctx))
    sessions = []
    with hang_guard(180):
        try:

            async def open_one() -> None:
                sessions.append(await env.open(config, FULL))

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(open_one)
            sessions.append(await env.open(config, FULL))
            assert env.images.builds == 1
            for session in sessions:
                result = await session.exec("pwd; cat /opt/state.txt /opt/built")
                assert result.stdout == f"/srv\ncontent {tmp_path.name}\nbuilt\n"
        finally:
            for session in sessions:
                await session.close()
        # A later run (a new provider) finds the image by its content's tag.
        later = provider(docker_daemon)
        session = await later.open(later.build_config(plan("Build/Once_1", build_context=ctx)), FULL)
        await session.close()
        assert later.images.builds == 0
        # Changed content is a new image.
        (ctx / "state.txt").write_text("changed\n")
        changed = provider(docker_daemon)
        session = await changed.open(changed.build_config(plan("Build/Once_1", build_context=ctx)), FULL)
        try:
            assert (await session.exec("cat /opt/state.txt")).stdout == "changed\n"
        finally:
            await session.close()
        assert changed.images.builds == 1


async def test_a_missing_image_with_pull_never_is_fatal_image_build_failed(docker_daemon):
    env = provider(docker_daemon, pull="never")
    with hang_guard(30), pytest.raises(IssueError) as caught:
        await env.open(env.build_config(plan("t", image="agentcompass/not-here:1")), FULL)
    assert (caught.value.severity, caught.value.code) == ("fatal", "image_build_failed")
    assert "pull is 'never'" in caught.value.message


async def test_a_failed_build_is_fatal_with_the_log_tail(docker_daemon, tmp_path: Path):
    ctx = context(tmp_path, "FROM agentcompass/base:bookworm\nRUN echo step-output-7f3a && exit 3\n")
    env = provider(docker_daemon)
    with hang_guard(120), pytest.raises(IssueError) as caught:
        await env.open(env.build_config(plan("broken", build_context=ctx)), FULL)
    assert (caught.value.severity, caught.value.code) == ("fatal", "image_build_failed")
    first, _, tail = caught.value.message.partition("\n")
    assert "broken" in first and "step-output-7f3a" in tail


async def test_a_build_past_its_timeout_is_fatal_setup_timeout(docker_daemon, tmp_path: Path):
    ctx = context(tmp_path, "FROM agentcompass/base:bookworm\nRUN sleep 60\n")
    env = provider(docker_daemon)
    config = env.build_config(plan("slow", build_context=ctx, build_timeout_seconds=2))
    with hang_guard(60), pytest.raises(IssueError) as caught:
        await env.open(config, FULL)
    assert (caught.value.severity, caught.value.code) == ("fatal", "setup_timeout")


async def test_workdir_env_and_user_of_the_plan_are_honoured(docker_daemon, tmp_path: Path):
    ctx = context(tmp_path, "FROM agentcompass/base:bookworm\nENV FROM_IMAGE=image\nWORKDIR /srv\n")
    env = provider(docker_daemon)
    spec = {"build_context": ctx, "workdir": "/work", "env": {"FROM_PLAN": "plan"}, "user": "nobody"}
    with hang_guard(120):
        session = await env.open(env.build_config(plan("honoured", **spec)), FULL)
        try:
            result = await session.exec('pwd; echo "$FROM_IMAGE $FROM_PLAN $EXTRA"; id -un', env={"EXTRA": "x"})
            assert result.stdout == "/work\nimage plan x\nnobody\n"
            await session.write_file("rel.txt", "relative")
            assert (await session.exec("cat /work/rel.txt")).stdout == "relative"
        finally:
            await session.close()
    # The root feature: the plan may ask for root.
    root = attrs.evolve(plan("root"), sandbox=SandboxSpec(user="root"))
    session = await env.open(env.build_config(root), FULL)
    try:
        assert (await session.exec("id -u")).stdout == "0\n"
    finally:
        await session.close()
