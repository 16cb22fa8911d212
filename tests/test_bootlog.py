"""analysis/bootlog.py `boot_failure`: the line of a server's log that says why it stopped at boot."""

from __future__ import annotations

import pytest

# Why a server stopped before it was healthy: logs captured from the test bed's llama-server (build
# 11434) as it refused a flag, a value, a missing model and a context it could not allocate; the
# answers written down before the rule ran.
BOOT_FAILURES = [
    ("error while handling argument \"-fa\": error: unknown value for --flash-attn: 'bogus'\n\nusage:\n"
     "to show complete usage, run with -h\n",
     "error while handling argument \"-fa\": error: unknown value for --flash-attn: 'bogus'"),
    ("error: invalid argument: --bogus-flag\n", "error: invalid argument: --bogus-flag"),
    ("0.00.005.230 E llama_model_load: error loading model: llama_model_loader: failed to load model from /m.gguf\n"
     "0.00.005.240 E llama_model_load_from_file_impl: failed to load model\n"
     "0.00.005.570 E srv  llama_server: exiting due to model loading error\n",
     "llama_model_load: error loading model: llama_model_loader: failed to load model from /m.gguf"),
    ("0.08.206.154 W common_fit_params: failed to fit params to free device memory: was unable to fit model\n"
     "0.15.679.370 E ggml_aligned_malloc: insufficient memory (attempted to allocate 2197265.62 MB)\n"
     "0.15.679.380 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 2304000000000\n"
     "0.16.116.032 E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n"
     "0.16.116.137 E srv    load_model: failed to create_context with model '/m.gguf'\n",
     "ggml_aligned_malloc: insufficient memory (attempted to allocate 2197265.62 MB)"),  # memory before the model
    ("main: server is listening\ncouldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080\n",
     "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080"),
    ("load_tensors: loading\n/src/ggml.c:1234: GGML_ASSERT(n > 0) failed\n", "/src/ggml.c:1234: GGML_ASSERT(n > 0) failed"),
    ("llama_context: n_ctx = 4096\nmain: server is listening\n", None),  # nothing says why
]


@pytest.mark.parametrize("log, why", BOOT_FAILURES)
def test_the_line_that_says_why_a_server_stopped_at_boot(log, why):
    from loadgen.analysis.bootlog import boot_failure

    assert boot_failure(log) == why
