"""Live metrics while a run goes on: metrics.py (loadgen's series, fed as an engine observer) and
endpoint.py (their Prometheus HTTP endpoint, in threads of its own)."""

# After a run, the endpoint stays up at most this long for its last scrape (--prometheus-linger).
# Here, not in endpoint.py, so that the flag's help is drawn without prometheus_client.
DEFAULT_LINGER_S = 15.0
