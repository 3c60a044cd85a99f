"""Datasets by name, end to end through ``compass``: a registry file of the
test's own naming tasks in real git repositories served from local
directories (``file://``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest
from _common import only_run_dir, read_json
from _dataset_support import (
    FAILING_TEST,
    commit,
    compass,
    entry,
    git,
    make_swe_task,
    make_task,
    new_repo,
    write_registry,
)


@attrs.frozen
class Project:
    root: Path
    repo: Path
    pinned: str
    newer: str
    registry: Path
    env: dict[str, str]

    @property
    def out(self) -> Path:
        return self.root / "work" / "out"


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A repository whose ``tasks/`` pass at the pinned commit and fail at the
    branch's newer one, a registry pinning the first, and a private cache."""
    repo = new_repo(tmp_path / "src" / "tb")
    make_task(repo / "tasks", "alpha")
    make_task(repo / "tasks", "beta")
    make_swe_task(repo / "tasks", "swe-one")
    pinned = commit(repo, "tasks that pass")
    for name in ("alpha", "beta"):
        (repo / "tasks" / name / "tests" / "test.sh").write_text(FAILING_TEST)
    newer = commit(repo, "tasks that fail")
    registry = write_registry(
        tmp_path / "registry.json", [entry("tb-mini", "1.0", repo, pinned, ["alpha", "beta", "swe-one"])]
    )
    (tmp_path / "work").mkdir()
    env = {"AGENTCOMPASS_DATASET_CACHE": str(tmp_path / "cache"), "AGENTCOMPASS_REGISTRY": str(registry)}
    return Project(tmp_path, repo, pinned, newer, registry, env)


def _run(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return compass(project.root / "work", "run", *args, "-e", "local", "--output-root", "out", env=project.env)


def test_a_dataset_by_name_runs_its_tasks_at_the_pinned_commits(project: Project) -> None:
    proc = _run(project, "--dataset", "tb-mini@1.0", "-a", "oracle")
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(project.out, "tb-mini-1.0-oracle")
    metrics = read_json(run_dir / "metrics.json")
    assert metrics["series"]["reward"]["value"] == 1.0  # the newer commit's tests would score 0
    source = read_json(run_dir / "run_info.json")["task_source"]
    assert source["registry"] == str(project.registry)
    assert source["dataset"] == "tb-mini@1.0"
    assert {name: t["commit"] for name, t in source["tasks"].items()} == dict.fromkeys(
        ("alpha", "beta", "swe-one"), project.pinned
    )

    # The second run needs no git server: the repository is gone, the cache serves it.
    shutil.rmtree(project.repo)
    again = _run(project, "--dataset", "tb-mini@1.0", "-a", "oracle", "--name", "again")
    assert again.returncode == 0, again.stderr
    run_dir = only_run_dir(project.out, "again")
    assert read_json(run_dir / "metrics.json")["series"]["reward"]["value"] == 1.0


def test_a_commit_that_cannot_be_had_is_one_line_and_exit_2(project: Project) -> None:
    registry = project.registry
    data = json.loads(registry.read_text())
    data[0]["tasks"][1]["git_commit_id"] = "0123456789abcdef0123456789abcdef01234567"
    registry.write_text(json.dumps(data))
    proc = _run(project, "--dataset", "tb-mini@1.0", "-a", "oracle")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "beta" in lines[0] and "0123456789abcdef" in lines[0], proc.stderr
    assert not (project.out).exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope@1.0", "dataset 'nope' is not in registry"),
        ("tb-mini@9", "has no version '9'"),
        ("../x@1", "not a valid name"),
    ],
)
def test_unknown_or_unsafe_dataset_names_are_config_errors(project: Project, spec: str, message: str) -> None:
    proc = _run(project, "--dataset", spec, "-a", "oracle")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_git_path_at_a_branch_is_recorded_as_its_commit(project: Project) -> None:
    url = f"git+{project.repo.as_uri()}@main#tasks"
    proc = _run(project, "--path", url, "-a", "oracle", "--name", "branch", "--task-id", "alpha")
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(project.out, "branch")
    assert read_json(run_dir / "metrics.json")["series"]["reward"]["value"] == 0.0  # main's newer commit fails alpha
    source = read_json(run_dir / "run_info.json")["task_source"]
    assert source["ref"] == "main" and source["commit"] == project.newer
    # At the pinned commit (given as a tag) the same task passes.
    git(project.repo, "tag", "v1", str(project.pinned))
    tagged = _run(project, "--path", url.replace("@main", "@v1"), "-a", "oracle", "--name", "tag", "--task-id", "alpha")
    assert tagged.returncode == 0, tagged.stderr
    run_dir = only_run_dir(project.out, "tag")
    assert read_json(run_dir / "metrics.json")["series"]["reward"]["value"] == 1.0
    assert read_json(run_dir / "run_info.json")["task_source"]["commit"] == project.pinned


def test_datasets_list_and_pull(project: Project) -> None:
    work = project.root / "work"
    listed = compass(work, "datasets", "list", "--registry", str(project.registry), env=project.env)
    assert listed.returncode == 0, listed.stderr
    assert "tb-mini@1.0" in listed.stdout and "3 tasks" in listed.stdout
    pulled = compass(work, "datasets", "pull", "tb-mini@1.0", env=project.env)
    assert pulled.returncode == 0, pulled.stderr
    assert "3 task(s) at 1 commit(s)" in pulled.stdout
    cache = Path(project.env["AGENTCOMPASS_DATASET_CACHE"])
    assert sorted(p.name for p in cache.glob("tasks/*/*")) == ["alpha", "beta", "swe-one"]


def test_a_config_names_the_dataset_and_its_registry_relative_to_itself(project: Project) -> None:
    (project.root / "config.yaml").write_text(
        "requests:\n"
        "  - name: from-config\n"
        "    benchmark: {id: terminal, config: {dataset: tb-mini@1.0, registry: registry.json}}\n"
        "    harness: oracle\n"
        "    environment: local\n"
        "    output_root: out\n"
    )
    env = {**project.env, "AGENTCOMPASS_REGISTRY": str(project.root / "elsewhere.json")}  # the config's wins
    proc = compass(project.root / "work", "launch", str(project.root / "config.yaml"), env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(project.root / "out", "from-config")
    assert read_json(run_dir / "run_info.json")["task_source"]["registry"] == str(project.registry)
