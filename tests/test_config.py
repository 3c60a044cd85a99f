"""Config loading, ``--set`` overrides, ``${VAR}`` expansion and preflight."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

from agentcompass import _registry
from agentcompass._config import (
    apply_override,
    build_orchestration,
    load_config,
)
from agentcompass._preflight import preflight
from agentcompass._redact import redact
from agentcompass.runtime._components import (
    BaseAnalyzer,
    BaseBenchmark,
    BaseEnvironment,
    BaseHarness,
    BaseRecipe,
    HarnessFreeBenchmark,
)
from agentcompass.runtime._errors import ComponentError, ConfigError
from agentcompass.runtime._values import (
    ComponentRef,
    Orchestration,
    ProviderLimits,
    Secret,
)


@_registry.register
class CfgBenchmark(BaseBenchmark):
    id = "cfg-bench"


@_registry.register
class CfgFreeBenchmark(HarnessFreeBenchmark):
    id = "cfg-free"


@attrs.frozen
class _PathConfig:
    path: str = "."


@_registry.register
class CfgConfiguredBenchmark(BaseBenchmark):
    id = "cfg-configured"
    Config: ClassVar[type | None] = _PathConfig


@_registry.register
class CfgHarness(BaseHarness):
    id = "cfg-harness"


@_registry.register
class CfgEnvironment(BaseEnvironment):
    id = "cfg-env"


@_registry.register
class CfgRecipe(BaseRecipe):
    id = "cfg-recipe"


@_registry.register
class CfgAnalyzer(BaseAnalyzer):
    id = "cfg-analyzer"


BASE = """
orchestration:
  task_concurrency: 2
  providers: {cfg-env: {capacity: 3, open_qps: 1.5}}
requests:
  - name: first
    benchmark: {id: cfg-bench, config: {path: tasks}}
    harness: cfg-harness
    environment: cfg-env
    recipes: [cfg-recipe]
    analyzers: [{id: cfg-analyzer}]
    execution:
      attempts: {k: 2, strategy: pass}
      max_retries: 1
      retry_pattern_list: ["timeout"]
  - name: second
    benchmark: cfg-free
    harness: none
    environment: {id: cfg-env}
    model: {name: m, base_url: "http://127.0.0.1:9/v1"}
"""


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str = BASE, overrides: tuple[str, ...] = ()) -> Orchestration:
    return load_config(write(tmp_path, text), overrides)


def check(tmp_path: Path, *overrides: str, text: str = BASE) -> Orchestration:
    orchestration = load(tmp_path, text, overrides)
    preflight(orchestration, tmp_path)
    return orchestration


def test_loads_a_valid_config(tmp_path: Path) -> None:
    orch = check(tmp_path)
    assert orch.task_concurrency == 2
    assert orch.providers == {"cfg-env": ProviderLimits(3, 1.5)}
    first, second = orch.requests
    assert first.benchmark == ComponentRef("cfg-bench", {"path": "tasks"})
    assert first.harness == ComponentRef("cfg-harness")
    assert first.recipes == [ComponentRef("cfg-recipe")]
    assert first.execution.attempts.k == 2
    assert first.output_root == Path("runs")
    assert second.harness.id == "none"
    assert second.model is not None and second.model.api == "openai-chat"


@pytest.mark.parametrize("api", ["openai-responses", "anthropic-messages"])
def test_the_responses_and_messages_apis_load_and_pass_preflight(tmp_path: Path, api: str) -> None:
    orch = check(tmp_path, f"requests[1].model.api={api}")
    assert orch.requests[1].model is not None and orch.requests[1].model.api == api


# ---------------------------------------------------------------- structure errors


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("orchestration:", "foo: 1\norchestration:", "unknown key 'foo' @ top level"),
        ("task_concurrency: 2", "task_concurency: 2", "unknown key 'task_concurency' @ orchestration"),
        ("capacity: 3", "capacty: 3", "unknown key 'capacty' @ orchestration.providers['cfg-env']"),
        ("  - name: first", "  - nmae: x\n    name: first", "unknown key 'nmae' @ requests[0]"),
        ("max_retries: 1", "max_retriez: 1", "unknown key 'max_retriez' @ requests[0].execution"),
        ("{k: 2, strategy: pass}", "{k: 2, strategy: pass, kk: 1}", "unknown key 'kk' @ requests[0].execution.attempts"),
        ("{id: cfg-analyzer}", "{id: cfg-analyzer, cfg: 1}", "unknown key 'cfg' @ requests[0].analyzers[0]"),
        ("{name: m,", "{name: m, base_ulr: x,", "unknown key 'base_ulr' @ requests[1].model"),
        ("{name: m,", "{name: m, api: anthropic,",
         "expected one of 'openai-chat', 'openai-responses', 'anthropic-messages', 'google-generate-content', 'none', got 'anthropic' @ requests[1].model.api"),
        ("max_retries: 1", "max_retries: '1'", "expected an integer, got '1' @ requests[0].execution.max_retries"),
        ("strategy: pass", "strategy: best", "expected one of 'avg', 'pass', got 'best'"),
        ('["timeout"]', '"timeout"', "expected a list, got 'timeout' @ requests[0].execution.retry_pattern_list"),
        ("task_concurrency: 2", "task_concurrency: 2\n  requests: []", "unknown key 'requests' @ orchestration"),
        ("max_retries: 1", "max_retries: 1\n      limits: {tokns: 5}", "unknown key 'tokns' @ requests[0].execution.limits"),
        ("max_retries: 1", "max_retries: 1\n      limits: {cost_usd: -1}", "'cost_usd' must be >= 0: -1.0 @ requests[0].execution.limits"),
        ("{name: m,", "{name: m, pricing: {input: 1},", "@ requests[1].model.pricing"),
    ],
)
def test_unknown_keys_and_bad_types_name_the_path(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in BASE
    with pytest.raises(ConfigError) as info:
        load(tmp_path, BASE.replace(old, new, 1))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config file not found: .*nope\.yaml$"):
        load_config(tmp_path / "nope.yaml")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)  # a directory


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^invalid YAML in .*config\.yaml line 3: ") as info:
        load(tmp_path, "requests:\n  - name: a\n\tbenchmark: b\n")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", ""])
def test_non_mapping_yaml(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        load(tmp_path, text)


def test_no_requests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no requests"):
        load(tmp_path, "orchestration: {task_concurrency: 1}\n")


# ---------------------------------------------------------------- preflight


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('execution.retry_pattern_list=["ok", "(unclosed"]',
         "requests[0] 'first': execution.retry_pattern_list[1]: invalid regex '(unclosed': missing )"),
        ("requests[0].execution.retry_min_delay_seconds=-1",
         "requests[0] 'first': execution.retry_min_delay_seconds must be a finite number > 0, got -1"),
        ("requests[0].execution.retry_max_delay_seconds=0.5",
         "execution.retry_max_delay_seconds (0.5) must be >= retry_min_delay_seconds (5)"),
        ("requests[1].execution.retry_max_delay_seconds=.inf", "requests[1] 'second': execution.retry_max_delay_seconds"),
        ("requests[0].execution.attempts.k=0", "requests[0] 'first': execution.attempts.k must be an integer >= 1, got 0"),
        ("requests[0].execution.max_retries=-1", "execution.max_retries must be an integer >= 0"),
        ("requests[0].execution.run_timeout_seconds=0", "execution.run_timeout_seconds must be a finite number > 0"),
        ("requests[0].execution.setup_timeout_seconds=.nan", "execution.setup_timeout_seconds must be a finite"),
        ("requests[0].execution.run_timer_compensation_seconds=-1", "run_timer_compensation_seconds must be a finite number >= 0"),
        ("requests[0].limit=-1", "limit must be an integer >= 0"),
        ("requests[0].task_ids=[a, a]", "task_ids: duplicate task id 'a'"),
        ("orchestration.task_concurrency=0", "orchestration.task_concurrency must be an integer >= 1, got 0"),
        ("orchestration.cleanup_grace_seconds=-1", "orchestration.cleanup_grace_seconds must be a finite number >= 0"),
        ("orchestration.timeout_seconds=0", "orchestration.timeout_seconds must be a finite number > 0"),
        ("orchestration.providers.cfg-env.capacity=-1", "orchestration.providers['cfg-env'].capacity must be an integer >= 0"),
        ("orchestration.providers.cfg-env.open_qps=.inf", "open_qps must be a finite number >= 0"),
        ("orchestration.providers.cfg-evn.capacity=1", "orchestration.providers['cfg-evn']: unknown environment id 'cfg-evn'"),
        ("requests[1].model.timeout_seconds=0", "requests[1] 'second': model.timeout_seconds must be a finite number > 0"),
        ("requests[1].model.max_connections=0", "model.max_connections must be an integer >= 1"),
        ("requests[1].model.base_url=localhost:8000", "model.base_url must start with http:// or https://"),
        ("requests[1].name=first", "requests[1] 'first': duplicate request name"),
        ("requests[1].name=''", "requests[1] '': name '' must be"),
        ("requests[1].name=a/b", "name 'a/b' must be"),
        ("requests[1].name=..", "name '..' must be"),
        ("requests[0].reuse=/no/such/run", "requests[0] 'first': reuse: run directory not found: /no/such/run"),
    ],
)
def test_preflight_value_checks(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check(tmp_path, override)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("requests[0].harness=cfg-harnes", "requests[0] 'first': unknown harness id 'cfg-harnes' (registered: "),
        ("requests[0].benchmark.id=nope", "requests[0] 'first': unknown benchmark id 'nope'"),
        ("requests[0].environment=cfg-bench", "requests[0] 'first': 'cfg-bench' is a benchmark id, not a environment id"),
        ("requests[0].recipes=[cfg-recip]", "requests[0] 'first': recipes[0]: unknown recipe id 'cfg-recip'"),
        ("requests[0].analyzers=[cfg-harness]", "analyzers[0]: 'cfg-harness' is a harness id, not a analyzer id"),
        ("requests[0].harness=none",
         "requests[0] 'first': harness 'none' needs a harness-free benchmark; benchmark 'cfg-bench' needs a harness"),
        ("requests[1].harness=cfg-harness",
         "requests[1] 'second': benchmark 'cfg-free' runs its own inference loop: set harness: none"),
        ("requests[0].benchmark={id: cfg-configured, config: {pth: x}}",
         "requests[0] 'first': benchmark 'cfg-configured': unknown key 'pth' @ config"),
        ("requests[0].benchmark={id: cfg-configured, config: {path: 3}}",
         "benchmark 'cfg-configured': expected a string, got 3 @ config.path"),
    ],
)
def test_preflight_component_checks(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ComponentError) as info:
        check(tmp_path, override)
    assert message in str(info.value)


def test_harness_free_benchmark_with_harness_none_passes(tmp_path: Path) -> None:
    orch = check(tmp_path, "requests[0].benchmark=cfg-free", "requests[0].harness=none")
    assert orch.requests[0].harness.id == "none"


def test_preflight_loads_plugins_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "cfg_plugin.py").write_text(
        "from agentcompass import register\n"
        "from agentcompass.runtime._components import BaseHarness\n"
        "@register\nclass P(BaseHarness):\n    id = 'cfg-plugin-harness'\n"
    )
    text = "plugins: [plugins/cfg_plugin.py]\n" + BASE.replace("harness: cfg-harness", "harness: cfg-plugin-harness")
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    orch = load(tmp_path, text)
    assert orch.plugins == [str(tmp_path / "plugins" / "cfg_plugin.py")]
    cwd = Path.cwd()
    try:
        os.chdir(elsewhere)  # plugin paths do not depend on the working directory
        preflight(orch)
    finally:
        os.chdir(cwd)
    assert orch.requests[0].harness.id == "cfg-plugin-harness"


def test_missing_plugin(tmp_path: Path) -> None:
    with pytest.raises(ComponentError, match="plugin file not found"):
        check(tmp_path, text="plugins: [nope.py]\n" + BASE)


# ---------------------------------------------------------------- ${VAR} expansion


ENV_CONFIG = """
plugins: ["${CFG_PLUGIN_DIR}/none.py"]
requests:
  - name: "run-${CFG_SUFFIX}"
    benchmark:
      id: cfg-bench
      config:
        path: "${CFG_DIR}/tasks"
        literal: "$${CFG_DIR}"
        token: "${CFG_TOKEN}"
        judge: {name: j, api_key: "${CFG_TOKEN}", note: "${CFG_SUFFIX}"}
        password: "pre-${CFG_SUFFIX}"
    harness: cfg-harness
    environment: cfg-env
    model: {name: m, api_key: "${CFG_TOKEN}", params: {token: "${CFG_SUFFIX}"}}
"""


@pytest.fixture
def env_vars(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    plugin_dir = tmp_path_factory.mktemp("plugins")
    (plugin_dir / "none.py").write_text("")  # imported at load: a plugin's Config says which values are paths
    for name, value in {
        "CFG_PLUGIN_DIR": str(plugin_dir),
        "CFG_SUFFIX": "x1",
        "CFG_DIR": "/data",
        "CFG_TOKEN": "tok-9f8e7d6c",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("env_vars")
def test_env_expansion_in_plain_strings(tmp_path: Path) -> None:
    orch = load(tmp_path, ENV_CONFIG)
    request = orch.requests[0]
    assert orch.plugins == [os.environ["CFG_PLUGIN_DIR"] + "/none.py"]
    assert request.name == "run-x1"
    assert request.benchmark.config["path"] == "/data/tasks"
    assert request.benchmark.config["literal"] == "${CFG_DIR}"
    assert request.benchmark.config["judge"]["note"] == "x1"
    assert request.model is not None
    assert request.model.params == {"token": "x1"}  # model params are not component config


@pytest.mark.usefixtures("env_vars")
def test_secrets_stay_secret(tmp_path: Path) -> None:
    request = load(tmp_path, ENV_CONFIG).requests[0]
    assert request.model is not None
    api_key = request.model.api_key
    assert isinstance(api_key, Secret)
    assert api_key.env_var == "CFG_TOKEN"
    assert api_key.reveal() == "tok-9f8e7d6c"
    config = request.benchmark.config
    for secret in (config["token"], config["judge"]["api_key"]):
        assert isinstance(secret, Secret)
        assert secret.env_var == "CFG_TOKEN"
        assert secret.reveal() == "tok-9f8e7d6c"
    assert isinstance(config["password"], Secret)
    assert config["password"].reveal() == "pre-x1"
    assert "tok-9f8e7d6c" not in repr(request)


@pytest.mark.usefixtures("env_vars")
def test_preflight_registers_secrets_for_redaction(tmp_path: Path) -> None:
    orch = load(tmp_path, ENV_CONFIG.replace('plugins: ["${CFG_PLUGIN_DIR}/none.py"]\n', ""))
    preflight(orch)
    assert redact("model said tok-9f8e7d6c and pre-x1") == "model said ********** and **********"


@pytest.mark.parametrize(
    ("var", "where"),
    [
        ("CFG_SUFFIX", "requests[0].name"),
        ("CFG_DIR", "requests[0].benchmark.config.path"),
        ("CFG_TOKEN", "requests[0].benchmark.config.token"),
        ("CFG_PLUGIN_DIR", "plugins[0]"),
    ],
)
def test_unset_variable_names_variable_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_vars: None, var: str, where: str
) -> None:
    monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match=rf"^environment variable {var} is not set @ {re.escape(where)}$"):
        load(tmp_path, ENV_CONFIG)


def test_unset_model_key_of_a_model_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CFG_UNSET_KEY", raising=False)
    orch = load(tmp_path, BASE.replace("{name: m,", "{name: m, api_key: '${CFG_UNSET_KEY}',"))
    with pytest.raises(
        ConfigError,
        match=r"^requests\[1\] 'second': environment variable CFG_UNSET_KEY is not set @ model\.api_key$",
    ):
        preflight(orch, tmp_path)


@_registry.register
class CfgModelFreeHarness(BaseHarness):
    id = "cfg-model-free"
    uses_model = False


def test_unset_model_key_is_fine_when_no_model_is_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CFG_UNSET_KEY", raising=False)
    text = BASE.replace("harness: cfg-harness", "harness: cfg-model-free\n    model: {name: m, api_key: '${CFG_UNSET_KEY}'}")
    orch = check(tmp_path, text=text)
    key = orch.requests[0].model.api_key  # type: ignore[union-attr]
    assert str(key) == "${CFG_UNSET_KEY}"
    text = text.replace("harness: cfg-model-free", "harness: cfg-harness")
    with pytest.raises(ConfigError, match=r"CFG_UNSET_KEY is not set @ model\.api_key"):
        check(tmp_path, text=text)


# ---------------------------------------------------------------- --set


def test_set_forms(tmp_path: Path) -> None:
    orch = load(
        tmp_path,
        overrides=(
            "orchestration.task_concurrency=8",
            "orchestration.timeout_seconds=90.5",
            "requests[0].execution.max_retries=2",
            "requests.1.execution.attempts.k=3",
            "execution.keep_environment=true",
            "benchmark.config.path=elsewhere",
            "requests[1].task_ids=[a, b]",
            "requests[0].model.name=filled",
        ),
    )
    first, second = orch.requests
    assert orch.task_concurrency == 8
    assert orch.timeout_seconds == 90.5
    assert first.execution.max_retries == 2
    assert second.execution.attempts.k == 3
    assert first.execution.keep_environment is True and second.execution.keep_environment is True
    assert first.benchmark.config == {"path": "elsewhere"}
    assert second.benchmark.config == {"path": "elsewhere"}
    assert second.task_ids == ["a", "b"]
    assert first.model is not None and first.model.name == "filled"


def test_set_is_applied_before_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CFG_NAME", "from-env")
    orch = load(tmp_path, overrides=("requests[0].name=${CFG_NAME}",))
    assert orch.requests[0].name == "from-env"


def test_set_unknown_leaf_is_reported_by_structure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'max_retriez' @ requests\[0\]\.execution"):
        load(tmp_path, overrides=("execution.max_retriez=2",))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("task_concurrency", "invalid override 'task_concurrency': expected key=value"),
        ("=3", "expected key=value"),
        ("nope.x=1", "unknown key 'nope'"),
        ("requests[5].name=x", "index 5 out of range (requests has 2 item(s))"),
        ("orchestration.task_concurrency.x=1", "orchestration.task_concurrency is not a mapping"),
        ("requests..name=x", "bad key"),
        ("requests[0]x.name=x", "bad key"),
        ("orchestration.x=[unclosed", "bad YAML value"),
    ],
)
def test_bad_overrides(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match="invalid override") as info:
        load(tmp_path, overrides=(override,))
    assert message in str(info.value)


def test_apply_override_needs_requests_for_request_fields() -> None:
    with pytest.raises(ConfigError, match="no requests"):
        apply_override({}, "execution.max_retries=1")


def test_build_orchestration_does_not_modify_its_input() -> None:
    data: dict[str, Any] = {"requests": [{"name": "a", "benchmark": "cfg-bench", "environment": "cfg-env"}]}
    build_orchestration(data, ["requests[0].name=b"])
    assert data["requests"][0]["name"] == "a"


# ---------------------------------------------------------------- paths relative to the config file


@attrs.frozen
class _Inner:
    data: Path
    label: str = "x"


@attrs.frozen
class _PathsConfig:
    root: Path
    extra: Path | None = None
    more: list[Path] = attrs.Factory(list)
    inner: _Inner | None = None
    name: str = "tasks"


@_registry.register
class CfgPathsBenchmark(BaseBenchmark):
    id = "cfg-paths"
    Config: ClassVar[type | None] = _PathsConfig


PATHS = """
requests:
  - name: paths
    benchmark:
      id: cfg-paths
      config: {root: data, extra: /abs/x, more: [a, ../b], inner: {data: in, label: keep}, name: not-a-path}
    harness: cfg-harness
    environment: cfg-env
    output_root: out
    reuse: old/run
"""


def test_paths_in_a_file_resolve_against_its_directory(tmp_path: Path) -> None:
    sub = tmp_path / "conf"
    sub.mkdir()
    request = load_config(write(sub, PATHS)).requests[0]
    assert request.benchmark.config == {
        "root": str(sub / "data"),
        "extra": "/abs/x",
        "more": [str(sub / "a"), str(tmp_path / "b")],
        "inner": {"data": str(sub / "in"), "label": "keep"},
        "name": "not-a-path",
    }
    assert request.output_root == sub / "out"
    assert request.reuse == sub / "old" / "run"


def test_default_output_root_and_command_line_values_stay_relative(tmp_path: Path) -> None:
    text = PATHS.replace("    output_root: out\n", "")
    request = load_config(write(tmp_path, text), ["benchmark.config.root=mine", "reuse=cli/run"]).requests[0]
    assert request.output_root == Path("runs")
    assert request.benchmark.config["root"] == "mine"  # --set is the command line: cwd-relative
    assert request.benchmark.config["more"][0] == str(tmp_path / "a")  # still from the file
    assert request.reuse == Path("cli/run")


def test_the_gateway_bounds_are_read_under_execution_and_checked(tmp_path: Path) -> None:
    from agentcompass import GatewaySpec

    sets = ("requests[0].execution.gateway.max_body_bytes=1048576", "requests[0].execution.gateway.max_json_depth=16")
    request = load(tmp_path, overrides=sets).requests[0]
    assert request.execution.gateway == GatewaySpec(max_body_bytes=1048576, max_json_depth=16)
    assert load(tmp_path).requests[0].execution.gateway == GatewaySpec()
    with pytest.raises(ConfigError, match=r"max_json_depth must be a positive integer, got 0 @ .*execution\.gateway"):
        load(tmp_path, overrides=("requests[0].execution.gateway.max_json_depth=0",))
