"""Real git repositories of task directories, served from local directories
(``file://``), and registry files of the tests' own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from _terminal_tasks import PASSING_TEST as PASSING_TEST
from _terminal_tasks import make_task as make_task

FAILING_TEST = 'echo 0 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_NOSYSTEM": "1",
}  # fmt: skip


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True).stdout


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    return path


def commit(repo: Path, message: str = "tasks") -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def write_registry(path: Path, datasets: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(datasets, indent=2))
    return path


def entry(
    name: str, version: str, repo: Path, commit_id: str, tasks: list[str], under: str = "tasks", **extra: Any
) -> dict[str, Any]:
    """A registry entry as Harbor writes one: each task a directory of the repository at a commit."""
    return {
        "name": name,
        "version": version,
        "description": f"{name} for tests",
        "tasks": [
            {"name": t, "git_url": repo.as_uri(), "git_commit_id": commit_id, "path": f"{under}/{t}"} for t in tasks
        ],
        **extra,
    }


def make_swe_task(root: Path, name: str, verifier_sleep: float = 0) -> Path:
    """A task in the shape Harbor's SWE-bench adapter writes: the repository
    at a commit as the starting files, a test patch, ``tests/test.sh`` that
    applies it, runs the named tests and writes the reward; ``solve.sh``
    applies the fix."""
    task = make_task(root, name, test_sh="", solve_sh=None)
    app = task / "environment"
    (app / "calc").mkdir(parents=True)
    (app / "calc" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    (app / "tests").mkdir()
    (app / "tests" / "__init__.py").write_text("")
    (task / "tests" / "test.patch").write_text(
        "--- /dev/null\n+++ b/tests/test_add.py\n@@ -0,0 +1,6 @@\n+import unittest\n+from calc import add\n+\n"
        "+class TestAdd(unittest.TestCase):\n+    def test_add(self):\n+        self.assertEqual(add(2, 3), 5)\n"
    )
    (task / "tests" / "test.sh").write_text(
        'cd "${APP_DIR:-/app}"\n'
        f"sleep {verifier_sleep}\n"
        'patch -s -p1 < "${TESTS_DIR:-/tests}/test.patch"\n'
        "if python3 -m unittest -q tests.test_add.TestAdd.test_add; then r=1; else r=0; fi\n"
        'echo $r > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'
    )
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text('cd "${APP_DIR:-/app}"\nsed -i "s/a - b/a + b/" calc/__init__.py\n')
    (task / "task.toml").write_text(
        'version = "1.0"\n[metadata]\ncategory = "swe"\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 60.0\n'
    )
    return task


def compass(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``compass ARGS`` in ``cwd``, this checkout's package first on the path."""
    import sys

    import agentcompass

    repo = Path(agentcompass.__file__).resolve().parents[1]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(repo), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env.pop("COMPASS_LOG_LEVEL", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", *args],
        capture_output=True, text=True, cwd=cwd, env=full_env, timeout=300, check=False,
    )  # fmt: skip
