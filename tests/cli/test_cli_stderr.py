"""The standard error of each mean (SPEC 8): ``metrics.json`` records it per
series and category, and ``summary.md`` and ``compass show`` print it as
``value ± stderr``, from a real run through the CLI."""

from __future__ import annotations

import math
from pathlib import Path

from _cli_support import compass, make_task, only_run_dir, read_json

FAILING_TEST = 'echo 0 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'


def test_run_reports_the_standard_error_beside_each_value(tmp_path: Path) -> None:
    # Three passing tasks and one failing: reward mean 0.75, stderr sqrt(0.25 / 4) = 0.25.
    for name in ("a", "b", "c"):
        make_task(tmp_path / "tasks", name)
    make_task(tmp_path / "tasks", "d", test_sh=FAILING_TEST)
    (tmp_path / "c.yaml").write_text(
        "requests:\n  - name: se\n    benchmark: {id: terminal, config: {path: tasks}}\n"
        "    harness: {id: oracle}\n    environment: {id: local}\n    output_root: out\n"
    )
    proc = compass(tmp_path, "launch", "c.yaml")
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "out", "se")

    series = read_json(run_dir / "metrics.json")["series"]
    rewards = [1.0, 1.0, 1.0, 0.0]
    mean = sum(rewards) / 4
    expected = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3 / 4)
    assert series["reward"]["value"] == 0.75
    assert math.isclose(series["reward"]["stderr"], expected) and math.isclose(expected, 0.25)
    assert math.isclose(series["passed"]["stderr"], 0.25)

    summary = (run_dir / "summary.md").read_text()
    assert "| reward | 0.7500 ± 0.2500 | 0.7500 | 4 | 0 | 0 | 0 | 4 |" in summary

    shown = compass(tmp_path, "show", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith("reward "))
    assert row.split()[:4] == ["reward", "0.7500", "±", "0.2500"]
