PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: agents demo demo-agent demo-docker demo-installed demo-sandbox docker-base system-deps test test-floors lint bench bench-inspect clean

# What the sandbox provider (bubblewrap, iproute2, nftables, util-linux), the docker
# provider's tests (docker.io, debootstrap), the installed agents' cache (python3,
# python3-venv; npm unless one is on PATH already) and the viewer's browser tests
# (chromium, chromium-driver) need from the system; docker-registry serves the sandbox's
# daemonless image pull a registry on loopback in its tests.
SYSTEM_PACKAGES := bubblewrap iproute2 nftables util-linux docker.io debootstrap python3 python3-venv chromium chromium-driver docker-registry

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The ray extra is in the test install (about 40 s from PyPI): its tests run
# on a loopback-only cluster (tests/_ray_support.py) and skip without it.
$(STAMP): $(BIN)/python setup.cfg pyproject.toml $(wildcard plugins/*/setup.cfg)
	$(BIN)/python -m pip install -q -e '.[test,lint,ray]' $(foreach p,$(wildcard plugins/*/setup.cfg),-e $(dir $(p)))
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/compass launch examples/quickstart.yaml --output-root runs/demo

# An agent run with no API key: a scripted model server on 127.0.0.1 and the react harness.
demo-agent: $(STAMP)
	$(BIN)/python -m agentcompass.testing.model_server --script examples/demo-agent.json -- \
		$(BIN)/compass launch examples/demo-agent.yaml --output-root runs/demo-agent

# The installed agents' host-side cache (built once per host and version, then reused):
# mini-swe-agent and aider from PyPI (about a minute and 700 MB each), Claude Code and
# Codex from npm (native executables, 235 and 424 MB, about 15 s each; needs npm).
agents: $(STAMP)
	$(BIN)/python -m agentcompass.agents install mini-swe-agent aider claude-code codex opencode qwen-code gemini-cli

# mini-swe-agent on two terminal smoke tasks and Claude Code on a third, in sandboxes with
# no network, reaching the scripted model server only through the attempt's model gateway
# (chat completions for one, Messages for the other; needs root).
demo-installed: $(STAMP) agents
	$(BIN)/python -m agentcompass.testing.model_server --script examples/demo-installed.json -- \
		$(BIN)/compass launch examples/demo-installed.yaml --output-root runs/demo-installed

# The same tasks in sandboxes, offline while the agent runs (needs root).
demo-sandbox: $(STAMP) system-deps
	$(BIN)/compass launch examples/sandbox.yaml --output-root runs/demo

# The docker provider's base image, made once per machine (debootstrap of Debian bookworm,
# minbase, kept as a tarball under ~/.cache/agentcompass/docker-base) and reused: tests
# and demos import it into their daemon as agentcompass/base:bookworm
# (python -m agentcompass_docker.base --host unix:///path/to/docker.sock).
docker-base: $(STAMP)
	$(BIN)/python -m agentcompass_docker.base

# The oracle on the tasks that need their image, in containers built from their
# Dockerfiles (the daemon at DOCKER_HOST, else one of its own for the demo; needs root then).
demo-docker: $(STAMP) docker-base
	$(BIN)/python -m agentcompass_docker.daemon -- \
		$(BIN)/compass launch examples/docker.yaml --output-root runs/demo-docker

# Installs the missing ones with apt-get when run as root on Debian/Ubuntu;
# otherwise says what is missing (the tests that need them skip).
system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done; \
	  command -v npm >/dev/null 2>&1 || echo npm); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update && apt-get install -y $$missing; \
	  else \
	    echo "missing system packages (their tests will skip):" $$missing; \
	  fi; \
	fi

# The real-agent tests use the agent cache: built here, once, not inside the suite's budget.
# On TEST_WORKERS pytest-xdist workers (most tests wait on subprocesses, sandboxes and
# daemons, not on a core): tests/_xdist_support.py keeps one Ray cluster and one dockerd
# per run and runs the tests marked serial alone. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP) agents lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests $(wildcard plugins/*/tests)

# The declared dependency floors, installed exactly (tests/rules/floors.py pins them) into a
# venv of their own, under the tests that exercise each dependency.
FLOORS := .venv-floors
FLOOR_TESTS := tests/rules/test_floors.py tests/test_exports.py tests/runtime/test_convert.py tests/test_config.py \
	tests/test_limits.py tests/test_observations.py tests/orchestration tests/store \
	tests/models tests/benchmarks/test_qa.py tests/harnesses/test_react.py tests/testing/test_model_server.py \
	tests/testing/test_model_server_agents.py tests/view/test_view_server.py plugins/remote/tests/test_remote_session.py

test-floors:
	rm -rf $(FLOORS)
	$(PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python -m pip install -q --upgrade pip
	$(FLOORS)/bin/python tests/rules/floors.py > $(FLOORS)/constraints.txt
	$(FLOORS)/bin/python -m pip install -q -c $(FLOORS)/constraints.txt -e '.[test]' -e plugins/remote -e plugins/sandbox
	COMPASS_FLOORS=1 $(FLOORS)/bin/python -m pytest -q -p no:cacheprovider $(FLOOR_TESTS)

# CI runs `make test`, which lints first. mypy's files, strictness and cache
# (.mypy_cache: a warm run takes about a second) are in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check agentcompass tests bench $(wildcard plugins)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

# The same, plus the Inspect AI side-by-side (installs inspect-ai into bench/.venv-inspect).
bench-inspect: $(STAMP)
	$(BIN)/python -m bench --inspect

clean:
	rm -rf $(VENV) $(FLOORS) runs .pytest_cache
