"""Plugins add command groups to ``compass`` through the ``agentcompass.cli``
entry-point group; the CLI imports them only when it needs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULE = '''
import click

@click.group()
def greet():
    """Say things."""

@greet.command()
@click.argument("name")
def hello(name):
    click.echo(f"hello {name}")

not_a_command = 42
'''


def _install(site: Path, entry_points: str) -> None:
    """A distribution on ``site``: its module and its entry points, as pip leaves them."""
    (site / "greet_plugin.py").write_text(MODULE)
    info = site / "greet_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: greet-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def _compass(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_plugin_command_group_runs_and_is_listed(tmp_path: Path):
    _install(tmp_path, "[agentcompass.cli]\ngreet = greet_plugin:greet\n")
    proc = _compass(tmp_path, "greet", "hello", "world")
    assert (proc.returncode, proc.stdout) == (0, "hello world\n"), proc.stderr
    listing = _compass(tmp_path, "--help")
    assert "greet" in listing.stdout and "Say things." in listing.stdout


def test_a_broken_plugin_command_is_one_line_and_leaves_the_others_working(tmp_path: Path):
    _install(
        tmp_path,
        "[agentcompass.cli]\nbroken = greet_plugin_missing:cli\nodd = greet_plugin:not_a_command\n",
    )
    for name, message in (("broken", "failed to import"), ("odd", "is not a click command")):
        proc = _compass(tmp_path, name)
        assert proc.returncode == 2 and message in proc.stderr and name in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert _compass(tmp_path, "list").returncode == 0
