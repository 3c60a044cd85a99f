"""The public surface is exactly what SPEC sections 3, 4 and 9 name."""

from __future__ import annotations

import ast
import pickle
import sys
import types
import typing
from pathlib import Path

import attrs

import agentcompass
import agentcompass.agents
import agentcompass.datasets
import agentcompass.gateway
import agentcompass.host
import agentcompass.models
import agentcompass.netpolicy
import agentcompass.runtime
import agentcompass.testing

SPEC_NAMES = {
    # SPEC 3: contracts
    "ModelSpec",
    "ComponentRef",
    "AttemptsSpec",
    "ExecutionSpec",
    "GatewaySpec",
    "RunRequest",
    "ProviderLimits",
    "Orchestration",
    "TaskSpec",
    "NetworkPolicy",
    "ExecutionPlan",
    "PreparedTask",
    "RunResult",
    "Issue",
    "Evaluation",
    "AttemptRecord",
    "TaskRecord",
    "RequestResult",
    "OrchestrationResult",
    "Secret",
    "SandboxSpec",
    # SPEC 12: budgets and cost
    "Limits",
    "Pricing",
    # SPEC 4: component contracts
    "BaseBenchmark",
    "HarnessFreeBenchmark",
    "BaseHarness",
    "BaseEnvironment",
    "EnvironmentSession",
    "BaseRecipe",
    "BaseAnalyzer",
    "Planner",
    "ExecResult",
    "RunBudget",
    "IssueError",
    "register",
    # SPEC 9: SDK
    "launch",
    "run_evaluation",
    "load_config",
    # SPEC 11
    "Executor",
}

# build_component: plugins that host other providers (remote sandbox servers) build them by id.
EXTRA_NAMES = {
    "NO_HARNESS",
    "NetworkOverrides",
    "CompassError",
    "ConfigError",
    "ComponentError",
    "RunFailedError",
    "FileRefusedError",
    "build_component",
    # The SDK reads a run directory back, leniently and by format (SPEC 12).
    "read_run",
    "StoredRun",
}


def _public(module: object) -> set[str]:
    # Subpackages (runtime, testing, the built-in components) appear once imported.
    return {
        name
        for name in dir(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
    }


def test_top_level_exports_exactly_the_public_surface():
    assert _public(agentcompass) == SPEC_NAMES | EXTRA_NAMES


def test_runtime_reexports_the_contracts():
    contracts = SPEC_NAMES - {"Planner", "register", "launch", "run_evaluation", "load_config"}
    assert contracts <= _public(agentcompass.runtime)
    for name in contracts:
        assert getattr(agentcompass, name) is getattr(agentcompass.runtime, name)


def test_run_failed_error_is_a_runtime_error():
    assert issubclass(agentcompass.RunFailedError, RuntimeError)
    assert issubclass(agentcompass.ConfigError, ValueError)


MODEL_NAMES = {
    "ChatClient", "ChatReply", "ModelError", "ModelUsage", "ToolCall", "chat_client", "open_model_clients",
    "MessagesClient", "ModelReply", "ResponsesClient", "messages_client", "model_client", "responses_client",
    "GeminiClient", "gemini_client",
}  # fmt: skip


def test_models_exports_the_model_client_api():
    # Harnesses and harness-free benchmarks (plugins included) get model clients from here.
    assert _public(agentcompass.models) == MODEL_NAMES
    assert issubclass(agentcompass.models.ModelError, agentcompass.IssueError)


def test_gateway_and_agents_export_their_apis():
    # A plugin harness opens a gateway; a plugin adds an agent to the table.
    assert _public(agentcompass.gateway) == {
        "Gateway", "GatewayRecord", "open_gateway", "TOKEN_VARIABLE", "URL_VARIABLE",
    }  # fmt: skip
    assert _public(agentcompass.agents) == {
        "AgentOutcome", "AgentRun", "InstalledAgent", "agent_table", "cache_root", "node_platform", "register_agent",
    }  # fmt: skip
    session = agentcompass.EnvironmentSession
    assert {"expose_directory", "expose_socket"} <= set(vars(session))


def test_netpolicy_exports_what_namespace_providers_share():
    # sandbox and docker build their nftables rules from it (docs/plugins.md).
    assert set(agentcompass.netpolicy.__all__) == {
        "TABLE", "AllowEntry", "Resolved", "check", "hosts_file", "lookup", "parse_allow", "resolve", "ruleset",
    }  # fmt: skip


def test_host_exports_what_providers_share():
    # sandbox, docker, remote and the runtime's store and agent cache lock, bind and mark with it (docs/plugins.md).
    assert _public(agentcompass.host) == set(agentcompass.host.__all__) == {
        "FileLock", "HostError", "SessionExists", "bind_read_only", "claim_state_dir", "read_marker", "unmount",
        "write_marker",
    }  # fmt: skip
    assert issubclass(agentcompass.host.SessionExists, agentcompass.host.HostError)
    assert issubclass(agentcompass.host.HostError, RuntimeError)


def test_datasets_exports_the_registry_and_cache_api():
    # compass datasets, the terminal benchmark and users' scripts resolve and fetch datasets through it.
    assert _public(agentcompass.datasets) == {
        "CACHE_VARIABLE", "DEFAULT_REGISTRY", "KNOWN_BENCHMARKS", "REGISTRY_VARIABLE", "Dataset", "DatasetTask",
        "GitPath", "KnownBenchmark", "PulledDataset", "cache_root", "declared", "fetch_task", "find_dataset",
        "known_benchmark", "pull_dataset", "pull_git_path", "read_registry", "registry_source", "resolve_ref",
        "split_spec",
    }  # fmt: skip


def test_runtime_exports_the_cleanup_deadline():
    # Providers (plugins included) bound their own shielded cleanup by it.
    assert {"cleanup_deadline", "DEFAULT_CLEANUP_GRACE_SECONDS"} <= _public(agentcompass.runtime)


def test_runtime_exports_the_exec_streaming_helpers():
    # Providers and the remote client cut streamed output with the same rule.
    assert {"OutputCallback", "OutputStream", "OutputTail", "exec_keeping_tails"} <= _public(agentcompass.runtime)


def test_runtime_exports_what_built_ins_share():
    # The terminal verifier and the oracle harness keep a command's output alike.
    assert "command_output" in _public(agentcompass.runtime)


RUNTIME = Path(agentcompass.runtime.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (TYPE_CHECKING ones too)."""
    package = "agentcompass.runtime"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            else:
                found.add(node.module or "")
    return found


def test_the_contracts_import_nothing_else_of_the_package():
    # agentcompass.runtime is the bottom layer: the engine, the store, the models
    # and the built-ins build on it, so it imports only the standard library,
    # third-party packages and itself.
    outside = {
        f"{path.name}: {name}"
        for path in sorted(RUNTIME.glob("*.py"))
        for name in _imported_modules(path)
        if (name == "agentcompass" or name.startswith("agentcompass."))
        and not (name == "agentcompass.runtime" or name.startswith("agentcompass.runtime."))
    }
    assert outside == set()


def test_the_import_walk_sees_relative_imports_outside_runtime(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from .._convert import x\nfrom . import _values\nimport trio\n")
    assert _imported_modules(module) == {"agentcompass._convert", "agentcompass.runtime", "trio"}


BUILT_INS = ("benchmarks", "harnesses", "environments")


def test_built_ins_import_only_public_modules_and_not_each_other():
    # Built-ins are the first plugins: a built-in module imports public
    # modules only (no path segment starting with "_"), and no other
    # built-in (what two share belongs in agentcompass.runtime).
    root = RUNTIME.parent
    reaches = set()
    for folder in BUILT_INS:
        for path in sorted((root / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("agentcompass"):
                    parts = node.module.split(".")
                    if any(part.startswith("_") for part in parts) or (parts[1:2] and parts[1] in BUILT_INS):
                        reaches.add(f"{folder}/{path.name}: {node.module}")
                elif isinstance(node, ast.ImportFrom) and node.level > 1:  # its own folder's modules are its own
                    reaches.add(f"{folder}/{path.name}: relative import {'.' * node.level}{node.module or ''}")
    assert reaches == set()


PUBLIC_MODULES = (
    agentcompass,
    agentcompass.runtime,
    agentcompass.models,
    agentcompass.gateway,
    agentcompass.agents,
    agentcompass.datasets,
    agentcompass.host,
    agentcompass.testing,
)


def _named(module: types.ModuleType) -> dict[str, object]:
    """The classes and functions a public module exports (the lazy engine names loaded)."""
    return {
        name: value
        for name in _public(module)
        if isinstance(value := getattr(module, name), (type, types.FunctionType))
    }


def test_public_names_report_the_module_that_exports_them():
    wrong = {}
    for module in PUBLIC_MODULES:
        for name, value in _named(module).items():
            home = "agentcompass" if getattr(agentcompass, name, None) is value else module.__name__
            if (value.__module__, value.__qualname__) != (home, name):
                wrong[f"{module.__name__}.{name}"] = f"{value.__module__}.{value.__qualname__}"
    assert wrong == {}


def test_public_names_pickle_by_their_public_path():
    for module in PUBLIC_MODULES:
        for value in _named(module).values():
            assert pickle.loads(pickle.dumps(value)) is value
    request = agentcompass.testing.fake_request()
    assert pickle.loads(pickle.dumps(request)) == request
    error = pickle.loads(pickle.dumps(agentcompass.ConfigError("bad key")))
    assert type(error) is agentcompass.ConfigError and error.args == ("bad key",)


def test_public_classes_keep_their_type_hints_and_reprs():
    # typing.get_type_hints, attrs and cattrs (and compass describe) look
    # annotation names up in __module__: the contracts must not lose what
    # their private module named.
    for module in (agentcompass, agentcompass.runtime):
        for value in _named(module).values():
            if isinstance(value, type):
                typing.get_type_hints(value)
                if attrs.has(value):
                    attrs.resolve_types(value)
    assert repr(agentcompass.Issue("error", "run", "x")).startswith("Issue(severity='error'")
    assert repr(agentcompass.RunRequest).startswith("<class 'agentcompass.RunRequest'>")
    assert "agentcompass.runtime" not in sys.modules["agentcompass"].ConfigError("x").__class__.__module__
