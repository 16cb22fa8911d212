"""`loadgen prefix`: groups of requests sharing an exact system prompt, cache on (command.py); the
requests are run/shared_prefix.py's, the figures analysis/cache.py's. docs/cache.md."""
