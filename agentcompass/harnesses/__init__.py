"""Built-in harnesses: ``oracle``, ``react``."""
