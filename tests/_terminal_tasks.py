"""Terminal-bench task directories written on the spot, for the tests of
the ``terminal`` benchmark and of the command line that runs it."""

from __future__ import annotations

from pathlib import Path

#: A verifier that always grants the reward.
PASSING_TEST = 'echo 1 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'


def make_task(
    root: Path,
    name: str,
    test_sh: str = PASSING_TEST,
    solve_sh: str | None = "true\n",
    env_files: dict[str, str] | None = None,
) -> Path:
    """A terminal task directory ``root/name``: its instruction, ``test_sh``,
    ``solve_sh`` (None: no solution) and files under ``environment/``."""
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text(f"Do {name}.\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    if solve_sh is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve_sh)
    for rel, content in (env_files or {}).items():
        (task / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / rel).write_text(content)
    return task
