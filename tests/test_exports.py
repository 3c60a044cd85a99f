"""The public surface is exactly what SPEC sections 3, 4 and 9 name."""

from __future__ import annotations

import types

import agentcompass
import agentcompass.runtime

SPEC_NAMES = {
    # SPEC 3: contracts
    "ModelSpec",
    "ComponentRef",
    "AttemptsSpec",
    "ExecutionSpec",
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


MODEL_NAMES = {"ChatClient", "ChatReply", "ModelError", "ModelUsage", "ToolCall", "chat_client", "open_model_clients"}


def test_runtime_exports_the_model_client_api():
    # Harnesses and harness-free benchmarks (plugins included) get model clients from here.
    assert MODEL_NAMES <= _public(agentcompass.runtime)
    assert issubclass(agentcompass.runtime.ModelError, agentcompass.IssueError)


def test_runtime_exports_the_cleanup_deadline():
    # Providers (plugins included) bound their own shielded cleanup by it.
    assert {"cleanup_deadline", "DEFAULT_CLEANUP_GRACE_SECONDS"} <= _public(agentcompass.runtime)


def test_runtime_exports_the_exec_streaming_helpers():
    # Providers and the remote client cut streamed output with the same rule.
    assert {"OutputCallback", "OutputStream", "OutputTail", "exec_keeping_tails"} <= _public(agentcompass.runtime)
