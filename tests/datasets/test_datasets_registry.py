"""Registries in Harbor's format, git paths and names, below the command line."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _dataset_support import commit, entry, make_task, new_repo, write_registry

from agentcompass import ComponentError, ConfigError, build_component
from agentcompass.datasets import DatasetTask, GitPath, fetch_task, find_dataset, read_registry, split_spec


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("git+https://example.org/org/tasks.git@v1.2#tasks", ("https://example.org/org/tasks.git", "v1.2", "tasks")),
        ("git+file:///srv/repo", ("file:///srv/repo", "HEAD", "")),
        ("git+ssh://git@host/org/r.git#a/b/", ("ssh://git@host/org/r.git", "HEAD", "a/b")),
        ("git+ssh://git@host/org/r.git@main", ("ssh://git@host/org/r.git", "main", "")),
    ],
)
def test_git_paths_parse(text: str, parsed: tuple[str, str, str]) -> None:
    assert GitPath.parse(text) == GitPath(*parsed)


@pytest.mark.parametrize(
    "text", ["git+https://h/r@main#../up", "git+-oProxy=x@main", "git+https://h/r@--upload-pack=x"]
)
def test_git_paths_that_leave_the_repository_or_look_like_options_are_refused(text: str) -> None:
    with pytest.raises(ComponentError):
        GitPath.parse(text)


@pytest.mark.parametrize("spec", ["../x@1", "a/b@1", "x@..", "x@1/2", "", "-rf@1"])
def test_dataset_names_are_single_path_components(spec: str) -> None:
    with pytest.raises(ComponentError):
        split_spec(spec)


def test_a_registry_task_path_cannot_leave_its_repository(tmp_path: Path) -> None:
    task = {"name": "t", "git_url": "file:///x", "git_commit_id": "a" * 40, "path": "../../etc"}
    registry = tmp_path / "r.json"
    registry.write_text(json.dumps([{"name": "d", "version": "1", "tasks": [task]}]))
    with pytest.raises(ComponentError, match="not a path inside its repository"):
        read_registry(str(registry))


def test_name_alone_takes_the_latest_version(tmp_path: Path) -> None:
    registry = tmp_path / "r.json"
    registry.write_text(json.dumps([{"name": "d", "version": v, "tasks": []} for v in ("1.9", "1.10", "1.2")]))
    datasets = read_registry(str(registry))
    assert find_dataset(datasets, "d", "r").version == "1.10"


def test_terminal_takes_exactly_one_of_path_and_dataset() -> None:
    with pytest.raises(ComponentError, match="exactly one of path and dataset"):
        build_component("benchmark", "terminal", {})
    with pytest.raises(ComponentError, match="exactly one of path and dataset"):
        build_component("benchmark", "terminal", {"path": "x", "dataset": "d@1"})


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A registry file served over HTTP on 127.0.0.1, and the file."""
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/registry.json", root / "registry.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_registry_url_is_read_and_its_copy_serves_when_it_is_gone(served: tuple[str, Path], tmp_path: Path) -> None:
    url, file = served
    repo = new_repo(tmp_path / "repo")
    make_task(repo / "tasks", "one")
    pinned = commit(repo)
    write_registry(file, [entry("d", "1.0", repo, pinned, ["one"])])
    cache = tmp_path / "cache"
    [dataset] = read_registry(url, cache)
    assert dataset.tasks == (DatasetTask("one", repo.as_uri(), pinned, "tasks/one"),)
    file.unlink()  # the server now answers 404: the copy kept in the cache answers
    assert read_registry(url, cache) == [dataset]
    with pytest.raises(ComponentError, match="cannot be read"):
        read_registry(url, tmp_path / "empty-cache")


async def test_an_abbreviated_commit_is_fetched_and_recorded_in_full(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "repo")
    make_task(repo / "tasks", "one")
    pinned = commit(repo)
    directory, recorded = await fetch_task(DatasetTask("one", repo.as_uri(), pinned[:10], "tasks/one"), tmp_path / "c")
    assert recorded == pinned
    assert (directory / "instruction.md").read_text() == "Do one.\n"


async def test_a_task_fetch_brings_its_own_files_not_the_repositorys(tmp_path: Path) -> None:
    from _dataset_support import git

    repo = new_repo(tmp_path / "repo")
    make_task(repo / "tasks", "small")
    make_task(repo / "tasks", "other", env_files={"big.bin": "x" * 100_000})
    git(repo, "config", "uploadpack.allowFilter", "true")  # as GitHub and most servers do
    pinned = commit(repo)
    cache = tmp_path / "c"
    await fetch_task(DatasetTask("small", repo.as_uri(), pinned, "tasks/small"), cache)
    [mirror] = (cache / "repos").iterdir()
    big = git(repo, "rev-parse", f"{pinned}:tasks/other/environment/big.bin").strip()
    mine = git(repo, "rev-parse", f"{pinned}:tasks/small/instruction.md").strip()
    missing = git(mirror, "rev-list", "--objects", "--missing=print", pinned).split()
    assert f"?{big}" in missing and f"?{mine}" not in missing


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            {"dataset": "terminal-bench@2.0", "agent": "oracle"},
            {"benchmark": "terminal", "harness": "oracle", "name": "terminal-bench-2.0-oracle",
             "benchmark_config": {"dataset": "terminal-bench@2.0"}, "harness_config": {}},
        ),
        (
            {"dataset": "swe-bench-verified@1.0", "agent": "claude-code", "registry": "r.json"},
            {"benchmark": "terminal", "harness": "installed", "name": "swe-bench-verified-1.0-claude-code",
             "benchmark_config": {"dataset": "swe-bench-verified@1.0", "registry": "r.json"},
             "harness_config": {"agent": "claude-code"}},
        ),
        (
            {"path": "git+file:///r@main#tasks", "harness": "react"},
            {"benchmark": "terminal", "harness": "react", "name": None,
             "benchmark_config": {"path": "git+file:///r@main#tasks"}, "harness_config": {}},
        ),
    ],
)  # fmt: skip
def test_run_flags_as_harbor_users_write_them(flags: dict[str, str], expected: dict[str, object]) -> None:
    from agentcompass._cli import _dataset_flags

    options = {"benchmark": None, "benchmark_config": "{}", "harness": None, "harness_config": "{}", "name": None}
    options.update({k: None for k in ("dataset", "path", "registry", "agent")})
    options.update(flags)
    _dataset_flags(options)
    options["benchmark_config"] = json.loads(options["benchmark_config"])  # type: ignore[arg-type]
    options["harness_config"] = json.loads(options["harness_config"])  # type: ignore[arg-type]
    assert options == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"dataset": "d@1", "path": "p"}, "not both"),
        ({"registry": "r.json"}, "--registry needs --dataset"),
        ({}, "give --benchmark, --dataset or --path"),
        ({"dataset": "d@1", "agent": "codex", "harness": "oracle"}, "disagree"),
    ],
)
def test_run_flags_that_contradict_each_other_are_usage_errors(flags: dict[str, str], message: str) -> None:
    from agentcompass._cli import _dataset_flags

    options = {"benchmark": None, "benchmark_config": "{}", "harness": None, "harness_config": "{}", "name": None}
    options.update({k: None for k in ("dataset", "path", "registry", "agent")})
    options.update(flags)
    with pytest.raises(ConfigError, match=message):
        _dataset_flags(options)


async def test_a_trio_application_launches_a_dataset(tmp_path: Path) -> None:
    import agentcompass
    from agentcompass import ComponentRef, Orchestration, RunRequest

    repo = new_repo(tmp_path / "repo")
    make_task(repo / "tasks", "one")
    pinned = commit(repo)
    registry = write_registry(tmp_path / "registry.json", [entry("d", "1.0", repo, pinned, ["one"])])
    request = RunRequest(
        name="sdk",
        benchmark=ComponentRef("terminal", {"dataset": "d@1.0", "registry": str(registry)}),
        harness=ComponentRef("oracle"),
        environment=ComponentRef("local"),
        output_root=tmp_path / "runs",
    )
    env = {"AGENTCOMPASS_DATASET_CACHE": str(tmp_path / "cache")}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        result = await agentcompass.launch(Orchestration([request]))
    assert result.status == "succeeded"
    [run] = result.requests
    info = json.loads((Path(run.run_dir) / "run_info.json").read_text())
    assert info["task_source"]["tasks"]["one"]["commit"] == pinned
