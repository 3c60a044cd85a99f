"""``python -m bench``: the AgentCompass performance suite (``make bench``).

Kept out of ``make test``: it measures, it does not assert. See
:mod:`bench.__main__` for the command line, :mod:`bench._scenarios` for what
each scenario does, :mod:`bench._inspect` for the Inspect AI side-by-side.
"""
