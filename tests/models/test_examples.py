"""The model examples validate, and name the model as the README says."""

from __future__ import annotations

import pytest
from _model_support import REPO

import agentcompass
from agentcompass._preflight import preflight


@pytest.mark.parametrize(
    ("name", "variable", "value"),
    [
        ("openai.yaml", "OPENAI_API_KEY", "sk-example-0123456789"),
        ("demo-agent.yaml", "MODEL_BASE_URL", "http://127.0.0.1:9/v1"),
    ],
)
def test_example_configs_validate(monkeypatch, name, variable, value):
    monkeypatch.setenv(variable, value)
    monkeypatch.chdir(REPO)
    orchestration = agentcompass.load_config(REPO / "examples" / name)
    preflight(orchestration, REPO / "examples")
    (request,) = orchestration.requests
    assert request.harness.id == "react" and request.model.api == "openai-chat"
    if variable == "OPENAI_API_KEY":
        assert request.model.api_key.reveal() == value and str(request.model.api_key) == "${OPENAI_API_KEY}"
    else:
        assert request.model.base_url == value
