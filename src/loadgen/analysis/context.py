"""Does a request fit the server's per-slot context? The one check every mode applies.

A llama-server slot holds `n_ctx` tokens (`/props` `default_generation_settings.n_ctx`: the `-c`
context divided among the `--parallel` slots). A prompt of P tokens that is to generate N more needs
P + N of them: a longer prompt is refused (HTTP 400), a shorter one that leaves no room for N is cut
short, and either way the figures are not those of the request asked for. Prefill and depth skip
such a size (its row says why); a sweep or soak, whose every request has that size, refuses the run.
"""

from __future__ import annotations


def context_overflow(prompt_tokens: int, n_predict: int, n_ctx: int | None) -> str | None:
    """What does not fit, "prompt P + n_predict N > per-slot n_ctx C", or None (it fits, or n_ctx is unknown)."""
    if n_ctx is None or prompt_tokens + n_predict <= n_ctx:
        return None
    return f"prompt {prompt_tokens:,} + n_predict {n_predict} > per-slot n_ctx {n_ctx:,}"
