from __future__ import annotations

import pytest

from testbed import start_llama_server


@pytest.fixture(scope="session")
def real_servers(tmp_path_factory):
    """Two real llama-servers: 4 slots and 1 slot, both with --metrics -c 4096 -t 1."""
    logs = tmp_path_factory.mktemp("llama-logs")
    four = start_llama_server("smollm2-4slot", 4, logs)
    try:
        one = start_llama_server("smollm2-1slot", 1, logs)
    except BaseException:
        four.stop()
        raise
    yield four, one
    four.stop()
    one.stop()
