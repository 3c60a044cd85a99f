PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-agent test lint bench bench-inspect clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python setup.cfg pyproject.toml $(wildcard plugins/*/setup.cfg)
	$(BIN)/python -m pip install -q -e '.[test,lint]' $(foreach p,$(wildcard plugins/*/setup.cfg),-e $(dir $(p)))
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/compass launch examples/quickstart.yaml --output-root runs/demo

# An agent run with no API key: a scripted model server on 127.0.0.1 and the react harness.
demo-agent: $(STAMP)
	$(BIN)/python -m agentcompass.testing.model_server --script examples/demo-agent.json -- \
		$(BIN)/compass launch examples/demo-agent.yaml --output-root runs/demo-agent

test: $(STAMP)
	$(BIN)/python -m pytest -q tests $(wildcard plugins/*/tests)

lint: $(STAMP)
	$(BIN)/ruff check agentcompass tests bench $(wildcard plugins)
	$(BIN)/mypy agentcompass/runtime

bench: $(STAMP)
	$(BIN)/python -m bench

# The same, plus the Inspect AI side-by-side (installs inspect-ai into bench/.venv-inspect).
bench-inspect: $(STAMP)
	$(BIN)/python -m bench --inspect

clean:
	rm -rf $(VENV) runs .pytest_cache
