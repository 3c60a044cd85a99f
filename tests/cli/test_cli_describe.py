"""Component options are discoverable: ``compass list --verbose`` and
``compass describe ID`` show each config key's type, default and doc,
read from the component's ``Config`` class."""

from __future__ import annotations

from pathlib import Path

from _cli_support import compass

PLUGIN = '''
from pathlib import Path
from typing import Literal

import attrs
from agentcompass import BaseBenchmark, register


@register
class Described(BaseBenchmark):
    """Questions from a JSONL file. More detail that the summary leaves out."""

    id = "described"
    metrics = ("correct", "latency")

    @attrs.frozen
    class Config:
        path: Path = attrs.field(metadata={"doc": "the JSONL file"})
        scoring: Literal["exact", "judge"] = attrs.field(default="exact", metadata={"doc": "how answers are compared"})
        limit: int | None = None
'''


def test_list_verbose_shows_config_keys(tmp_path: Path) -> None:
    (tmp_path / "described.py").write_text(PLUGIN)
    proc = compass(tmp_path, "list", "--verbose", "--plugin", "described.py")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["benchmark", "described"])
    assert lines[start + 1 : start + 9] == [
        "    Questions from a JSONL file.",
        "    metrics: correct, latency (primary: correct)",
        "    config keys:",
        "      path: path (required)",
        "          the JSONL file",
        "      scoring: 'exact' | 'judge' (default 'exact')",
        "          how answers are compared",
        "      limit: int | null (default None)",
    ]
    # The built-ins too, terminal's keys among them.
    assert "      eval_mode: 'reuse' | 'none' | 'fresh' (default 'reuse')" in lines


def test_describe_one_component(tmp_path: Path) -> None:
    proc = compass(tmp_path, "describe", "terminal")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "benchmark 'terminal' from agentcompass.benchmarks.terminal"
    assert "    path: path (required)" in proc.stdout.splitlines()
    oracle = compass(tmp_path, "describe", "oracle")
    assert "  config: no keys" in oracle.stdout.splitlines()


def test_describe_unknown_id(tmp_path: Path) -> None:
    proc = compass(tmp_path, "describe", "nope")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no component with id 'nope' (registered: ")
