"""``orchestration.executor`` in config and preflight (SPEC 11), without Ray running."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from agentcompass import ConfigError, Orchestration
from agentcompass._config import build_orchestration
from agentcompass._executors import check_executor


def _orchestration(executor: object) -> Orchestration:
    data = {
        "orchestration": {"executor": executor},
        "requests": [{"name": "r", "benchmark": {"id": "qa"}, "environment": {"id": "local"}}],
    }
    return build_orchestration(data)


def test_the_default_is_in_process() -> None:
    orchestration = _orchestration({"id": "inprocess"})
    assert orchestration.executor.id == "inprocess"
    check_executor(orchestration)
    assert Orchestration([]).executor.id == "inprocess"


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        ({"id": "slurm"}, "orchestration.executor: unknown executor 'slurm' (expected one of inprocess, ray)"),
        ({"id": "inprocess", "config": {"workers": 2}}, "orchestration.executor: inprocess takes no config"),
    ],
)
def test_an_unknown_executor_or_setting_is_one_line(executor: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_executor(_orchestration(executor))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'agentcompass[ray]')")
@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"adress": "local"}, "unknown key 'adress' @ orchestration.executor.config"),
        ({"workers": 0}, "orchestration.executor.config.workers: expected an integer >= 1, got 0"),
        ({"worker_concurrency": True}, "orchestration.executor.config.worker_concurrency: expected an integer >= 1"),
        ({"address": "http://head"}, "orchestration.executor.config.address: expected local, auto"),
        ({"runtime_env": []}, "orchestration.executor.config.runtime_env: expected a mapping"),
    ],
)
def test_ray_settings_are_checked_in_preflight(config: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_executor(_orchestration({"id": "ray", "config": config}))
    assert message in str(caught.value)


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None or importlib.util.find_spec("grpc") is not None,
    reason="needs Ray without Ray Client (grpcio)",
)
def test_ray_client_without_it_says_how_to_install_it() -> None:
    with pytest.raises(ConfigError, match=r"ray://head:10001 connects through Ray Client.*pip install 'ray\[client\]'"):
        check_executor(_orchestration({"id": "ray", "config": {"address": "ray://head:10001"}}))


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here")
def test_ray_without_ray_says_how_to_install_it() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'agentcompass\[ray\]'"):
        check_executor(_orchestration({"id": "ray"}))


def test_a_local_cluster_removes_the_directories_of_dead_drivers(tmp_path: Path) -> None:
    from agentcompass._ray import _cluster

    parent = tmp_path / "compass-ray"
    (parent / "killed").mkdir(parents=True)
    done = subprocess.Popen(["true"])
    done.wait()
    (parent / "killed" / "driver.pid").write_text(str(done.pid))
    (parent / "alive").mkdir()
    (parent / "alive" / "driver.pid").write_text(str(os.getppid()))

    made = Path(_cluster._temp_dir(str(tmp_path)))

    assert sorted(p.name for p in parent.iterdir()) == sorted(["alive", made.name])
    assert (made / "driver.pid").read_text() == str(os.getpid())
