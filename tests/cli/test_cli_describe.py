"""Component options are discoverable: ``compass list --verbose`` and
``compass describe ID`` show each config key's type, default and doc,
read from the component's ``Config`` class."""

from __future__ import annotations

from pathlib import Path

from _cli_support import compass, make_task

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
    assert "    path: path | null (default None)" in proc.stdout.splitlines()
    assert "    dataset: str | null (default None)" in proc.stdout.splitlines()
    oracle = compass(tmp_path, "describe", "oracle")
    assert "  config: no keys" in oracle.stdout.splitlines()


def test_describe_unknown_id(tmp_path: Path) -> None:
    proc = compass(tmp_path, "describe", "nope")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no component with id 'nope' (registered: ")


def _keys(lines: list[str]) -> dict[str, tuple[str, str]]:
    """``key -> (type and default, doc)`` of ``describe`` output's key lines."""
    found = {}
    for i, line in enumerate(lines):
        if line.startswith("    ") and not line.startswith("     ") and ": " in line:
            key, rest = line.strip().split(": ", 1)
            doc = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("        ") else ""
            found[key] = (rest, doc)
    return found


def test_describe_execution_documents_every_request_execution_key(tmp_path: Path) -> None:
    proc = compass(tmp_path, "describe", "execution")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "execution: the keys of the `requests[].execution` block of a config"
    keys = _keys(lines)
    # The default that surprises people, and what it means.
    assert keys["max_retries"][0] == "int (default 0)"
    assert "0: no retry, the first failure is final" in keys["max_retries"][1]
    assert keys["retry_pattern_list"][0] == "list[str] | null (default None)"
    # Nested values by their own keys, as a config writes them.
    assert keys["attempts.k"][0] == "int (default 1)"
    assert keys["attempts.strategy"][0] == "'avg' | 'pass' (default 'avg')"
    assert set(keys) >= {"network.baseline", "network.run", "network.evaluation", "run_timeout_seconds"}
    assert "attempts" not in keys and "network" not in keys
    assert all(doc for _, doc in keys.values()), [k for k, (_, doc) in keys.items() if not doc]


def test_described_keys_are_the_ones_a_config_takes(tmp_path: Path) -> None:
    """Every documented key is accepted where ``describe`` says it goes (and a
    misspelt one is not), so the page cannot drift from the config."""
    make_task(tmp_path / "tasks", "t1")
    config = tmp_path / "c.yaml"
    config.write_text(
        "requests:\n  - name: r\n    benchmark: {id: terminal, config: {path: tasks}}\n"
        "    harness: {id: oracle}\n    environment: {id: local}\n"
    )
    values = {"attempts.strategy": "pass", "retry_pattern_list": "[x]", "evaluation_environment_mode": "reuse",
              "network.baseline": "full", "network.run": "full", "network.evaluation": "full",
              "keep_environment": "false", "providers": "{}", "sandbox.env": "{}",
              "executor": "{id: inprocess}"}
    # The sandbox keys take null here: local has none of the features an image or a limit needs.
    values.update({f"sandbox.{key}": "null" for key in
                   ("image", "build_context", "build_timeout_seconds", "workdir", "cpus", "memory_mb", "storage_mb", "user")})
    sets = []
    for block, prefix in (("execution", "requests[0].execution."), ("orchestration", "orchestration.")):
        for key in _keys(compass(tmp_path, "describe", block).stdout.splitlines()):
            sets += ["--set", f"{prefix}{key.replace('<id>', 'local')}={values.get(key, '3')}"]
    assert len(sets) > 2 * 20
    proc = compass(tmp_path, "validate", str(config), *sets)
    assert proc.returncode == 0, proc.stderr
    proc = compass(tmp_path, "validate", str(config), "--set", "requests[0].execution.max_retriez=1")
    assert proc.returncode == 2
    # A sandbox value the provider cannot honour is refused before anything runs.
    proc = compass(tmp_path, "validate", str(config), "--set", "requests[0].execution.sandbox.memory_mb=512")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("execution.sandbox: environment 'local' lacks limits (see compass list --verbose)")


def test_describe_orchestration(tmp_path: Path) -> None:
    proc = compass(tmp_path, "describe", "orchestration")
    assert proc.returncode == 0, proc.stderr
    keys = _keys(proc.stdout.splitlines())
    assert keys["task_concurrency"][0] == "int (default 4)"
    assert keys["cleanup_grace_seconds"][0] == "float (default 30)"
    assert keys["providers.<id>.capacity"] == ("int (default 0)", "sandboxes of this provider open at once; 0: no limit")
    assert keys["providers.<id>.open_qps"][1] == "sandbox opens per second; 0: no limit"
    # Top-level keys of the file, not of the block.
    assert "requests" not in keys and "plugins" not in keys
    assert all(doc for _, doc in keys.values())


def test_list_verbose_documents_sandbox_keys_and_local(tmp_path: Path) -> None:
    proc = compass(tmp_path, "list", "--verbose")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["environment", "sandbox"])
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    block = lines[start:end]
    for key in ("memory_mb", "pids_max", "max_output_bytes", "reuse_network_namespaces", "tmpfs_mb"):
        at = next(i for i, line in enumerate(block) if line.strip().startswith(f"{key}:"))
        assert block[at + 1].startswith("          ") and block[at + 1].strip(), key  # its doc line
    assert "      memory_mb: int | null (default None)" in block
    assert "          memory limit of the whole session (cgroup)" in block
    local = lines[next(i for i, line in enumerate(lines) if line.split()[:2] == ["environment", "local"]) + 1]
    assert local == "    A fresh directory per session on this host, commands run as your user: no isolation, open network."
    assert lines[-1] == "Request and run settings: compass describe execution, compass describe orchestration"
