"""Relative paths in a config file resolve against the file (SPEC 9), and
``compass validate`` catches what ``launch`` would, before anything is written."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from _cli_support import REPO, compass, make_task, only_run_dir, read_json

CONFIG = """
requests:
  - name: rel
    benchmark: {id: terminal, config: {path: tasks}}
    harness: oracle
    environment: local
    output_root: out
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """``tmp/project/{config.yaml,tasks/}`` and an unrelated ``tmp/elsewhere`` to run from."""
    root = tmp_path / "project"
    make_task(root / "tasks", "one")
    (root / "config.yaml").write_text(textwrap.dedent(CONFIG))
    (tmp_path / "elsewhere").mkdir()
    return root


def test_launch_from_another_directory_resolves_against_the_config(project: Path) -> None:
    elsewhere = project.parent / "elsewhere"
    proc = compass(elsewhere, "launch", str(project / "config.yaml"))
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(project / "out", "rel")  # output_root: next to the config, not the cwd
    assert read_json(run_dir / "metrics.json")["series"]["reward"]["value"] == 1.0
    assert read_json(run_dir / "run_info.json")["request"]["benchmark"]["config"]["path"] == str(project / "tasks")
    assert list(elsewhere.iterdir()) == []


def test_command_line_output_root_is_relative_to_the_cwd(project: Path) -> None:
    elsewhere = project.parent / "elsewhere"
    proc = compass(elsewhere, "launch", str(project / "config.yaml"), "--output-root", "mine")
    assert proc.returncode == 0, proc.stderr
    assert only_run_dir(elsewhere / "mine", "rel").is_dir()
    assert not (project / "out").exists()


def test_the_bundled_example_validates_from_anywhere(tmp_path: Path) -> None:
    proc = compass(tmp_path, "validate", str(REPO / "examples" / "quickstart.yaml"))
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok: 1 request(s)"), proc.stderr


def _break_missing_path(project: Path) -> tuple[str, ...]:
    (project / "config.yaml").write_text(textwrap.dedent(CONFIG).replace("path: tasks", "path: nowhere"))
    return ()


def _break_empty_task_set(project: Path) -> tuple[str, ...]:
    (project / "empty").mkdir()
    (project / "config.yaml").write_text(textwrap.dedent(CONFIG).replace("path: tasks", "path: empty"))
    return ()


def _break_empty_task_dir(project: Path) -> tuple[str, ...]:
    (project / "tasks" / "blank").mkdir()
    return ()


def _break_no_test_sh(project: Path) -> tuple[str, ...]:
    (project / "tasks" / "one" / "tests" / "test.sh").unlink()
    return ()


def _break_unknown_task_id(project: Path) -> tuple[str, ...]:
    return ("--set", "task_ids=[one, nope]")


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (_break_missing_path, r"benchmark 'terminal': path: task directory '.*/project/nowhere' does not exist"),
        (_break_empty_task_set, r"benchmark 'terminal': path: no task directories in '.*/project/empty'"),
        (_break_empty_task_dir, r"benchmark 'terminal': path: task 'blank' has no instruction.md"),
        (_break_no_test_sh, r"benchmark 'terminal': path: task 'one' has no tests/test.sh"),
        (_break_unknown_task_id, r"benchmark 'terminal': task_ids: no task 'nope' in '.*/project/tasks'"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "launch"])
def test_what_launch_would_trip_over_is_a_config_error(
    project: Path, breakage: object, message: str, command: str
) -> None:
    extra = breakage(project)  # type: ignore[operator]
    proc = compass(project.parent / "elsewhere", command, str(project / "config.yaml"), *extra)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: requests[0] 'rel': ")
    assert re.search(message, line), line
    assert proc.stdout == ""
    assert not (project / "out").exists()  # nothing written
