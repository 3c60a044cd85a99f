"""``image_source`` (SPEC 12 "Image source"): a task naming an image that
cannot be pulled runs from its Dockerfile with ``build`` and
``prebuilt_else_build`` (one WARNING per request), and is FATAL
``image_build_failed`` naming the image with ``prebuilt``; the built tag
follows the Dockerfile's ``FROM`` image, so a rebuilt base is rebuilt on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from _common import read_json
from _docker_support import provider
from agentcompass_docker.base import BASE_IMAGE

import agentcompass
from agentcompass import ComponentRef, ExecutionPlan, NetworkPolicy, SandboxSpec
from agentcompass.testing import hang_guard

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="docker on Linux")

REPO = Path(agentcompass.__file__).resolve().parents[1]
#: A registry nothing listens on: the pull fails at once, as behind a firewall.
UNREACHABLE = "127.0.0.1:9/nowhere/task:20251031"
TEST_SH = "test -f /opt/from-dockerfile && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
_GIT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _task(root: Path, name: str, base: str = BASE_IMAGE) -> Path:
    task = root / name
    for sub in ("tests", "solution", "environment"):
        (task / sub).mkdir(parents=True)
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "solution" / "solve.sh").write_text("true\n")
    # The ANSI colours are what a build's output often carries: build.log drops them.
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {base}\nRUN printf '\\033[1;32mcoloured\\033[0m\\n' && touch /opt/from-dockerfile\nWORKDIR /app\n"
    )
    (task / "task.toml").write_text(f'version = "1.0"\n[environment]\ndocker_image = "{UNREACHABLE}"\n')
    return task


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_GIT}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def dataset(tmp_path: Path) -> dict[str, str]:
    """A dataset of two such tasks in a git repository, and its registry file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    unique = uuid.uuid4().hex[:8]  # a fresh image per test run: the build happens here
    for name in (f"first-{unique}", f"second-{unique}"):
        _task(repo / "tasks", name)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "tasks")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    tasks = [
        {"name": d.name, "git_url": repo.as_uri(), "git_commit_id": commit, "path": f"tasks/{d.name}"}
        for d in sorted((repo / "tasks").iterdir())
    ]
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps([{"name": "images", "version": "1.0", "description": "d", "tasks": tasks}]))
    return {"AGENTCOMPASS_REGISTRY": str(registry), "AGENTCOMPASS_DATASET_CACHE": str(tmp_path / "cache")}


def _run(
    tmp_path: Path, env: dict[str, str], daemon: Any, source: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    config = json.dumps({"host": daemon.host, "pull": "missing", "image_source": source})
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", "run", "--dataset", "images@1.0", "-e", "docker",
         "--environment-config", config, "--harness", "oracle", "--name", source, "--output-root", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600, env=full_env, check=False,
    )  # fmt: skip
    [run] = (tmp_path / "runs" / source).iterdir()
    return done, run


def _records(run: Path) -> list[dict[str, Any]]:
    return [read_json(p) for p in sorted(run.glob("details/*/*.json"))]


def test_image_source_builds_what_cannot_be_pulled(docker_daemon: Any, dataset: dict[str, str], tmp_path: Path) -> None:
    done, run = _run(tmp_path, dataset, docker_daemon, "build")
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(run)
    assert [r["attempts"][0]["values"]["reward"] for r in records] == [1.0, 1.0]
    assert all(r["attempts"][0]["issues"] == [] for r in records)
    logs = sorted(run.glob("tasks/*/attempt-0/logs/build.log"))
    assert len(logs) == 2
    text = logs[0].read_bytes()
    assert b"coloured" in text and b"\x1b" not in text
    assert all("image_build" in r["attempts"][0]["timings"] for r in records)

    # Pulled first, built when the pull fails: one WARNING for the request.
    done, run = _run(tmp_path, dataset, docker_daemon, "prebuilt_else_build")
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(run)
    assert [r["attempts"][0]["values"]["reward"] for r in records] == [1.0, 1.0]
    warnings = [i for r in records for i in r["attempts"][0]["issues"]]
    assert [(i["severity"], i["code"]) for i in warnings] == [("warning", "image_built_instead")]
    assert UNREACHABLE in warnings[0]["message"]

    # As the task's author meant by default: its image, which cannot be had.
    done, run = _run(tmp_path, dataset, docker_daemon, "prebuilt")
    assert done.returncode == 1
    for record in _records(run):
        issue = record["attempts"][0]["issues"][0]
        assert (record["severity"], issue["severity"], issue["code"]) == ("fatal", "fatal", "image_build_failed")
        assert UNREACHABLE in issue["message"]
        diagnostics = json.dumps(record["attempts"][0]["run_result"]["artifacts"]["execution_diagnostics"])
        assert "\\u001b" not in diagnostics


async def test_a_rebuilt_from_image_is_built_on_again(docker_daemon: Any, tmp_path: Path) -> None:
    """The task image's tag hashes its base's id: a new base, a new build."""
    base = f"compass-test/base-{uuid.uuid4().hex[:8]}:1"

    async def make_base(content: str) -> None:
        env = provider(docker_daemon)
        context = tmp_path / f"base-{content}"
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo {content} > /opt/base\n")
        tag = await env.images.built(f"base-{content}", context)
        name, version = base.rsplit(":", 1)
        await env.engine.request("POST", f"/images/{tag}/tag", params={"repo": name, "tag": version})
        await env.aclose()

    task = _task(tmp_path, "on-base", base=base)
    plan = ExecutionPlan(
        "on-base", 0, ComponentRef("docker", {}), sandbox=SandboxSpec(build_context=task / "environment")
    )

    async def open_once() -> tuple[int, str]:
        env = provider(docker_daemon)
        session = await env.open(env.build_config(plan), NetworkPolicy("full"))
        try:
            return env.images.builds, (await session.exec("cat /opt/base")).stdout.strip()
        finally:
            await session.close()
            await env.aclose()

    with hang_guard(300):
        await make_base("one")
        assert await open_once() == (1, "one")
        assert await open_once() == (0, "one")  # unchanged: found by its tag
        await make_base("two")
        assert await open_once() == (1, "two")


def test_a_failed_build_keeps_its_log_without_escapes(docker_daemon: Any, tmp_path: Path) -> None:
    task = _task(tmp_path / "tasks", f"broken-{uuid.uuid4().hex[:8]}")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN printf '\\033[1;31mboom-in-red\\033[0m\\n' && exit 3\n"
    )
    config = json.dumps({"host": docker_daemon.host, "pull": "never", "image_source": "build"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", "run", "-p", str(tmp_path / "tasks"), "-e", "docker",
         "--environment-config", config, "-a", "oracle", "--name", "broken", "--output-root", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    [run] = (tmp_path / "runs" / "broken").iterdir()
    [record] = _records(run)
    [attempt] = record["attempts"]
    assert attempt["issues"][0]["code"] == "image_build_failed"
    [build_log] = run.glob("tasks/*/attempt-0/logs/build.log")
    text = build_log.read_bytes()
    assert b"boom-in-red" in text and b"\x1b" not in text
    diagnostics = json.dumps(attempt["run_result"]["artifacts"]["execution_diagnostics"])
    assert "boom-in-red" in diagnostics and "\\u001b" not in diagnostics
    assert "setup" in attempt["timings"]
