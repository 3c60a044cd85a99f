"""What ``build_config`` accepts and refuses, the image names it makes, and
the build context's hash: no daemon needed."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest
from agentcompass_docker import DockerEnvironment
from agentcompass_docker._images import context_tar, repository_name, split_reference
from hypothesis import given
from hypothesis import strategies as st

from agentcompass import ComponentError, ComponentRef, ExecutionPlan, IssueError, NetworkPolicy, SandboxSpec

# Docker's reference grammar for one path component.
COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")


class NotRoot(DockerEnvironment):
    def host_euid(self) -> int:
        return 1000


def plan(**fields) -> ExecutionPlan:
    return ExecutionPlan("t", 0, ComponentRef("docker", {}), **fields)


def test_a_task_without_image_needs_default_image():
    with pytest.raises(ComponentError, match="default_image"):
        DockerEnvironment({}).build_config(plan())
    config = DockerEnvironment({"default_image": "debian:12"}).build_config(plan())
    assert config.image == "debian:12" and config.build_context is None


def test_plan_fields_override_provider_defaults(tmp_path: Path):
    env = DockerEnvironment({"memory_mb": 512, "cpus": 2, "pids_max": 64, "default_image": "x"})
    config = env.build_config(plan(sandbox=SandboxSpec(build_context=tmp_path, memory_mb=128, user="root")))
    assert (config.image, config.build_context) == (None, os.fspath(tmp_path))
    assert (config.container.memory_mb, config.container.cpus, config.container.pids_max) == (128, 2, 64)
    assert config.container.user == "root"
    # A named image and a build context are both kept: image_source chooses when the session opens.
    named = env.build_config(plan(sandbox=SandboxSpec(image="img:1", build_context=tmp_path)))
    assert (named.image, named.build_context) == ("img:1", os.fspath(tmp_path))


def test_image_source_is_one_of_three():
    with pytest.raises(ComponentError, match="image_source"):
        DockerEnvironment({"image_source": "force"})


def test_rule_based_policies_need_root_and_are_refused_otherwise():
    env = NotRoot({"default_image": "x"})
    env.build_config(plan())  # full everywhere: nothing to install
    for mode in ("none", "allowlist"):
        with pytest.raises(ComponentError, match="needs root"):
            env.build_config(plan(run_network_policy=NetworkPolicy(mode, ("10.0.0.1",) if mode == "allowlist" else ())))
    with pytest.raises(ComponentError, match="port must be"):
        DockerEnvironment({"default_image": "x"}).build_config(
            plan(run_network_policy=NetworkPolicy("allowlist", ("example.com:0",)))
        )


def test_config_keys_are_checked():
    with pytest.raises(Exception, match="pull"):
        DockerEnvironment({"pull": "sometimes"})
    with pytest.raises(Exception, match="memory_mb"):
        DockerEnvironment({"memory_mb": -1})


async def test_open_refuses_a_name_the_runtime_would_not_give():
    env = DockerEnvironment({"default_image": "x", "host": "unix:///nonexistent.sock"})
    with pytest.raises(IssueError, match="must match"):
        await env.open(env.build_config(plan()), NetworkPolicy("full"), name="Bad_Name")


@given(st.text(min_size=0, max_size=300))
def test_repository_names_are_valid_docker_components(task_id: str):
    name = repository_name(task_id)
    assert COMPONENT.fullmatch(name) and len(name) <= 100


def test_references_split_into_name_and_tag():
    assert split_reference("busybox") == ("busybox", "latest")
    assert split_reference("registry:5000/team/img") == ("registry:5000/team/img", "latest")
    assert split_reference("registry:5000/team/img:1.2") == ("registry:5000/team/img", "1.2")
    assert split_reference("img@sha256:abc") == ("img@sha256:abc", "")


def test_the_context_tar_keeps_links_as_links_and_its_hash_follows_content(tmp_path: Path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\n")
    (ctx / "data.txt").write_text("one")
    outside = tmp_path / "secret"
    outside.write_text("host secret")
    (ctx / "link").symlink_to(outside)
    out = io.BytesIO()
    first = context_tar(ctx, out)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["link"].issym() and members["link"].linkname == str(outside)
        assert b"host secret" not in out.getvalue()
        assert tar.extractfile("data.txt").read() == b"one"
    assert context_tar(ctx, io.BytesIO()) == first
    (ctx / "data.txt").write_text("two")
    assert context_tar(ctx, io.BytesIO()) != first
    (ctx / "Dockerfile").unlink()
    with pytest.raises(IssueError, match="no Dockerfile"):
        context_tar(ctx, io.BytesIO())
