"""Datasets by name: Harbor-format registries, pinned git task sources and
the content-addressed cache they are fetched into (public API:
:mod:`agentcompass.datasets`)."""
