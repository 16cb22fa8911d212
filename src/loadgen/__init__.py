"""loadgen: an async load generator and concurrency tester for LLM inference servers."""

__version__ = "0.1.0"
