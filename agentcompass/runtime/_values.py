"""Request-side values: what a user asks the runtime to do.

Every class here is an immutable ``attrs`` value. Change one with
``attrs.evolve``; turn one into JSON (or back) with the converter in
``agentcompass._convert``, never with methods on the class.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs

from ._sandbox_values import FULL_NETWORK, NetworkOverrides, NetworkPolicy, SandboxSpec

__all__ = [
    "AttemptsSpec",
    "ComponentRef",
    "EvaluationMode",
    "ExecutionPlan",
    "ExecutionSpec",
    "GatewaySpec",
    "Limits",
    "ModelSpec",
    "NetworkOverrides",
    "NetworkPolicy",
    "NO_HARNESS",
    "Orchestration",
    "PreparedTask",
    "Pricing",
    "ProviderLimits",
    "RunRequest",
    "SandboxSpec",
    "Secret",
    "TaskSpec",
]

EvaluationMode = Literal["reuse", "none", "fresh"]


@attrs.frozen(repr=False)
class Secret:
    """A credential that never prints, logs or serializes in clear.

    ``str()``, ``repr()`` and the JSON converter all show ``**********``, or
    the ``${ENV_VAR}`` reference the value was read from, which round-trips
    without ever writing the value itself. Call :meth:`reveal` at the one
    place the clear value is needed (an HTTP header, a subprocess env).
    """

    _value: str = attrs.field(eq=False)
    env_var: str | None = None

    MASK: ClassVar[str] = "**********"

    @classmethod
    def from_env(cls, name: str) -> Secret:
        """Read ``name`` from the process environment (empty when unset)."""
        return cls(os.environ.get(name, ""), env_var=name)

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return f"${{{self.env_var}}}" if self.env_var else self.MASK

    def __repr__(self) -> str:
        return f"Secret({str(self)!r})"

    def __bool__(self) -> bool:
        return bool(self._value)


@attrs.frozen
class ComponentRef:
    """Names a registered component (``id``) and the settings it is built with."""

    id: str
    config: dict[str, Any] = attrs.Factory(dict)


#: The harness of a request whose benchmark runs itself (``harness: {id: none}``).
NO_HARNESS = ComponentRef("none")


def _optional(check: Any) -> Any:
    return attrs.validators.optional(check)


@attrs.frozen
class Pricing:
    """What a model's tokens cost, in USD per million tokens.

    ``cached_input`` prices the prompt tokens the upstream reports as read
    from its cache (``None``: priced as ``input``). A call's cost is
    ``(prompt - cached) * input + cached * cached_input + completion *
    output``, divided by a million.
    """

    input: float = attrs.field(validator=attrs.validators.ge(0), metadata={"doc": "USD per million prompt tokens"})
    output: float = attrs.field(validator=attrs.validators.ge(0), metadata={"doc": "USD per million completion tokens"})
    cached_input: float | None = attrs.field(
        default=None,
        validator=_optional(attrs.validators.ge(0)),
        metadata={"doc": "USD per million prompt tokens read from the upstream's cache (null: as input)"},
    )


@attrs.frozen
class ModelSpec:
    """A model endpoint. A request value, not a registered component.

    ``api`` is ``"openai-chat"`` (any OpenAI-compatible ``/chat/completions``
    server: vLLM, SGLang, Ollama, LiteLLM), ``"openai-responses"`` (the
    OpenAI Responses API, ``/responses``), ``"anthropic-messages"`` (the
    Anthropic Messages API, ``/messages``; ``base_url`` ends in ``/v1`` as
    for the others), ``"google-generate-content"`` (Google's Gemini API,
    ``/models/{name}:generateContent``; ``base_url`` is its version root,
    e.g. ``https://generativelanguage.googleapis.com/v1beta``) or ``"none"``.
    """

    name: str
    api: Literal["openai-chat", "openai-responses", "anthropic-messages", "google-generate-content", "none"] = (
        "openai-chat"
    )
    base_url: str | None = None
    api_key: Secret | None = None
    params: dict[str, Any] = attrs.Factory(dict)
    timeout_seconds: float | None = None
    max_connections: int | None = None
    pricing: Pricing | None = None


@attrs.frozen
class AttemptsSpec:
    """``k`` semantic attempts per task; ``avg`` runs all of them, ``pass`` stops
    after the first valid success of the primary metric."""

    k: int = attrs.field(default=1, metadata={"doc": "attempts per task, each run and scored on its own"})
    strategy: Literal["avg", "pass"] = attrs.field(
        default="avg",
        metadata={"doc": "avg: run all k, the task scores their mean; pass: stop at the first success, 1 if any"},
    )


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen
class GatewaySpec:
    """The model gateway's bounds per attempt (SPEC 12 "Gateway bounds").

    A request body over ``max_body_bytes`` is refused with 413 and one nested
    deeper than ``max_json_depth`` with 400, before anything is forwarded. Of
    each call the trajectory keeps at most ``record_request_bytes`` of the
    request's new messages and ``record_reply_bytes`` of the reply; once an
    attempt's record holds ``record_attempt_bytes``, later calls are recorded
    as counts and sizes only. What is cut is counted in bytes.
    """

    max_body_bytes: int = attrs.field(
        default=8 * 1024 * 1024,
        validator=_positive,
        metadata={"doc": "largest request body an agent may send (413 past it)"},
    )
    max_json_depth: int = attrs.field(
        default=128, validator=_positive, metadata={"doc": "deepest JSON nesting of a request body (400 past it)"}
    )
    record_request_bytes: int = attrs.field(
        default=256 * 1024, validator=_positive, metadata={"doc": "of each call's request, what the trajectory keeps"}
    )
    record_reply_bytes: int = attrs.field(
        default=256 * 1024, validator=_positive, metadata={"doc": "of each call's reply, what the trajectory keeps"}
    )
    record_attempt_bytes: int = attrs.field(
        default=64 * 1024 * 1024,
        validator=_positive,
        metadata={"doc": "what an attempt's calls may record in all; past it only counts and sizes"},
    )


@attrs.frozen
class Limits:
    """Budgets of one attempt's run, enforced on the wire (SPEC 12 "Budgets and cost").

    ``model_calls`` bounds the calls to the model, ``tokens`` their prompt
    plus completion tokens as the upstream reports them, ``cost_usd`` their
    cost (from ``ModelSpec.pricing`` or the cost the upstream reports; a call
    of unknown cost adds nothing). ``None`` leaves a budget open. A call is
    made while every budget has room; once one is used up, the next call is
    refused before it reaches the model (the API's own 429 through the
    gateway, :class:`ModelError` in the runtime's client) and the attempt
    records ERROR ``harness_limit_reached`` naming the limit; the output so
    far is scored. The call that crosses ``tokens`` or ``cost_usd`` is
    answered (its size is known only once it is), so usage may end above
    the budget by at most that one call.
    """

    model_calls: int | None = attrs.field(
        default=None,
        validator=_optional(attrs.validators.ge(0)),
        metadata={"doc": "model calls per attempt (null: no limit)"},
    )
    tokens: int | None = attrs.field(
        default=None,
        validator=_optional(attrs.validators.ge(0)),
        metadata={"doc": "prompt + completion tokens per attempt, as the upstream reports them (null: no limit)"},
    )
    cost_usd: float | None = attrs.field(
        default=None,
        validator=_optional(attrs.validators.ge(0)),
        metadata={"doc": "USD per attempt, from the model's pricing or the upstream's reported cost (null: no limit)"},
    )

    def tightened(self, model_calls: int | None) -> Limits:
        """These limits with ``model_calls`` lowered to ``model_calls`` (an alias such as ``max_model_calls``)."""
        if model_calls is None or (self.model_calls is not None and self.model_calls <= model_calls):
            return self
        return attrs.evolve(self, model_calls=model_calls)


@attrs.frozen
class ExecutionSpec:
    """How each task of a request is executed (attempts, retries, timeouts).

    ``evaluation_environment_mode`` and ``network`` are explicit user values
    that override the benchmark's plan and every recipe (SPEC section 9).
    """

    attempts: AttemptsSpec = attrs.field(default=AttemptsSpec(), metadata={"doc": "attempts per task"})
    max_retries: int = attrs.field(
        default=0,
        metadata={
            "doc": "extra tries of an attempt after a retryable failure, shared by its stages; "
            "0: no retry, the first failure is final"
        },
    )
    retry_pattern_list: list[str] | None = attrs.field(
        default=None,
        metadata={
            "doc": "regexes: an ERROR whose code or message matches one is retried; "
            "null or []: no ERROR is (a FATAL always is, while max_retries lasts)"
        },
    )
    retry_min_delay_seconds: float = attrs.field(
        default=5, metadata={"doc": "backoff before the first retry; it doubles per retry, jittered down to half"}
    )
    retry_max_delay_seconds: float = attrs.field(
        default=60, metadata={"doc": "the backoff's ceiling (a service's Retry-After too)"}
    )
    setup_timeout_seconds: float | None = attrs.field(
        default=None,
        metadata={"doc": "bound on opening the sandbox and preparing the task, once capacity is held; null: none"},
    )
    run_timeout_seconds: float | None = attrs.field(
        default=None, metadata={"doc": "the agent's budget; null: the benchmark's (terminal: task.toml), else none"}
    )
    run_timer_compensation_seconds: float = attrs.field(
        default=30, metadata={"doc": "grace past the run budget before the runtime stops the run (ERROR run_failed)"}
    )
    evaluation_timeout_seconds: float | None = attrs.field(
        default=None,
        metadata={"doc": "bound on collecting artifacts and evaluating; null: the benchmark's, else none"},
    )
    keep_environment: bool = attrs.field(
        default=False, metadata={"doc": "leave each sandbox as it is after its attempt, to inspect; nothing reaps it"}
    )
    evaluation_environment_mode: EvaluationMode | None = attrs.field(
        default=None,
        metadata={
            "doc": "where evaluation runs: reuse (the task's sandbox), fresh (a new one), none; null: the benchmark's"
        },
    )
    network: NetworkOverrides = attrs.field(
        default=NetworkOverrides(), metadata={"doc": "network policy per phase, over the benchmark's and recipes'"}
    )
    sandbox: SandboxSpec = attrs.field(
        default=SandboxSpec(),
        metadata={
            "doc": "what each task's sandbox is (image, workdir, env, limits), over the benchmark's, field by field"
        },
    )
    gateway: GatewaySpec = attrs.field(
        default=GatewaySpec(), metadata={"doc": "the model gateway's bounds on request bodies and on what is recorded"}
    )
    limits: Limits = attrs.field(
        default=Limits(), metadata={"doc": "budgets per attempt: model_calls, tokens, cost_usd (none by default)"}
    )


@attrs.frozen
class RunRequest:
    """One model x benchmark x harness x environment x execution combination.

    ``harness`` is :data:`NO_HARNESS` (id ``none``) for a harness-free
    benchmark. ``reuse`` is ``False``, ``True`` (the latest run of this
    request under ``output_root``) or the path of a run directory. Only a
    run of the same experiment is reused (SPEC section 8);
    ``reuse_anyway`` reuses a run that differs too (recorded in its
    ``run_info.json``).
    """

    name: str
    benchmark: ComponentRef
    environment: ComponentRef
    harness: ComponentRef = NO_HARNESS
    model: ModelSpec | None = None
    recipes: list[ComponentRef] = attrs.Factory(list)
    analyzers: list[ComponentRef] = attrs.Factory(list)
    execution: ExecutionSpec = ExecutionSpec()
    task_ids: list[str] | None = None
    limit: int | None = None
    output_root: Path = Path("runs")
    reuse: bool | Path = False
    reuse_anyway: bool = False


@attrs.frozen
class ProviderLimits:
    """Limits for one Environment provider id; ``0`` disables a limit."""

    capacity: int = attrs.field(default=0, metadata={"doc": "sandboxes of this provider open at once; 0: no limit"})
    open_qps: float = attrs.field(default=0, metadata={"doc": "sandbox opens per second; 0: no limit"})


@attrs.frozen
class Orchestration:
    """Everything one ``launch`` runs: requests plus global scheduling settings."""

    requests: list[RunRequest] = attrs.field(metadata={"doc": "the requests, prepared in declaration order"})
    task_concurrency: int = attrs.field(
        default=4, metadata={"doc": "tasks run at once, from one pool shared by all requests (earliest first)"}
    )
    timeout_seconds: float | None = attrs.field(
        default=None,
        metadata={"doc": "overall deadline, from after the checks; then nothing new starts and results are written"},
    )
    cleanup_grace_seconds: float = attrs.field(
        default=30, metadata={"doc": "how long every way out (closing sandboxes, final writes) may take"}
    )
    providers: dict[str, ProviderLimits] = attrs.field(
        factory=dict, metadata={"doc": "limits per environment id (local, sandbox, ...)"}
    )
    plugins: list[str] = attrs.field(
        factory=list, metadata={"doc": "modules or .py files that register components (relative to the config file)"}
    )
    executor: ComponentRef = attrs.field(
        default=ComponentRef("inprocess"),
        metadata={
            "doc": "where tasks run: {id: inprocess} (this process) or {id: ray, config: {address, workers, "
            "worker_concurrency, runtime_env}} (a Ray cluster; pip install 'agentcompass[ray]')"
        },
    )


@attrs.frozen
class TaskSpec:
    """One task as a benchmark loaded it. ``task_id`` is unique in its benchmark."""

    task_id: str
    data: dict[str, Any] = attrs.Factory(dict)
    category: str | None = None
    metadata: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen
class ExecutionPlan:
    """Everything decided for one attempt before it runs; made once per attempt
    by the :class:`~agentcompass.Planner` and reused by every retry of it."""

    task_id: str
    attempt: int
    environment: ComponentRef
    harness: ComponentRef = NO_HARNESS
    benchmark_plan: dict[str, Any] = attrs.Factory(dict)
    evaluation_environment_mode: EvaluationMode = "reuse"
    baseline_network_policy: NetworkPolicy = FULL_NETWORK
    run_network_policy: NetworkPolicy = FULL_NETWORK
    evaluation_network_policy: NetworkPolicy = FULL_NETWORK
    run_timeout_seconds: float | None = None
    evaluation_timeout_seconds: float | None = None
    sandbox: SandboxSpec = SandboxSpec()


@attrs.frozen
class PreparedTask:
    """A task made ready to run in one Environment session (``input`` for the agent).

    ``expected`` is the reference answer the evaluation compares against,
    where the benchmark has one (``qa``: the answer; ``None`` for ``terminal``,
    whose tests decide). It is kept in the attempt record for readers (the
    viewer shows it beside the input); a harness never gives it to the agent.
    """

    task: TaskSpec
    input: dict[str, Any] = attrs.Factory(dict)
    metadata: dict[str, Any] = attrs.Factory(dict)
    expected: Any = None
