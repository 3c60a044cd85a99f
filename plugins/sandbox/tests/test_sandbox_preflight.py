"""Preflight: a host that cannot run sandboxes is refused with one line and
exit 2 before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentcompass_sandbox import host_problem

_PLUGIN = '''
from agentcompass import register
from agentcompass_sandbox import SandboxEnvironment


@register
class NoBwrap(SandboxEnvironment):
    """The sandbox provider on a host without bubblewrap."""

    id = "sandbox-no-bwrap"
    def find_program(self, program):
        return None if program == "bwrap" else "/usr/bin/" + program
'''


def test_host_problem_names_what_is_missing() -> None:
    assert host_problem(euid=lambda: 1000) == (
        "the sandbox provider needs root (to create network namespaces, veths and cgroups)"
    )
    missing = host_problem(euid=lambda: 0, which=lambda program: None if program in ("bwrap", "nft") else "/bin/x")
    assert missing is not None and missing.startswith("the sandbox provider needs bwrap, nft on PATH")


def test_cli_exits_2_with_one_line_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "nobwrap.py").write_text(_PLUGIN)
    config = tmp_path / "c.yaml"
    config.write_text(
        "plugins: [nobwrap.py]\n"
        "requests:\n"
        "  - name: r\n"
        f"    benchmark: {{id: terminal, config: {{path: {Path(__file__).parents[3] / 'benchmarks_data/terminal-smoke'}}}}}\n"
        "    harness: {id: oracle}\n"
        "    environment: {id: sandbox-no-bwrap}\n"
    )
    compass = str(Path(sys.executable).with_name("compass"))
    for command in (["validate", str(config)], ["launch", str(config), "--output-root", str(tmp_path / "runs")]):
        done = subprocess.run([compass, *command], capture_output=True, text=True, check=False)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert lines == [
            "error: requests[0] 'r': environment 'sandbox-no-bwrap': the sandbox provider needs bwrap on PATH "
            "(apt-get install bubblewrap nftables util-linux)"
        ]
    assert not (tmp_path / "runs").exists()
