"""Live metrics while a run goes on: metrics.py (loadgen's series, fed as an engine observer) and
endpoint.py (their Prometheus HTTP endpoint, in threads of its own)."""
