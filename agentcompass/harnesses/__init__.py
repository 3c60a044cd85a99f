"""Built-in harnesses: ``oracle``."""
