"""llama-server's `/metrics`: the counters the scheduler feeds, and their Prometheus text.

Names, help texts, types and semantics of llama.cpp build 11434 (server-task.cpp `to_metrics`,
server-context.cpp `metrics_*`):
- prompt counters move per decode call that carried prompt tokens; the seconds are that call's
  wall time (engine clock). Cached prompt tokens are counted apart, when a prompt is matched.
- tokens_predicted_total / tokens_predicted_seconds_total move only when a slot is released
  (request finished or cancelled), by its n_decoded and its predicted_ms.
- the two rate gauges cover the window since the previous scrape, and every scrape resets it:
      prompt_tokens_seconds    = prompt tokens / prompt seconds, over the window
      predicted_tokens_seconds = sum(predicted_n - 1) / sum(predicted_ms) * 1000 over the
                                 requests released in the window: per-sequence speed, not throughput
- n_busy_slots_per_decode = busy slots summed over decode calls / decode calls.
Values print like C++'s default ostream: %g, six significant digits (1.23457e+06).
"""

from __future__ import annotations

from dataclasses import dataclass

# (name, type, help), in the order llama-server prints them.
_FAMILIES = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    ("n_decode_total", "counter",
     "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
)

METRIC_NAMES = tuple(f"llamacpp:{name}" for name, _, _ in _FAMILIES)


@dataclass(slots=True)
class ServerMetrics:
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_ms_total: float = 0.0
    tokens_predicted_total: int = 0
    predicted_ms_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    # The window since the last scrape.
    window_prompt_tokens: int = 0
    window_prompt_ms: float = 0.0
    window_decode_steps: int = 0
    window_predicted_ms: float = 0.0

    def on_cache_match(self, n_cached: int) -> None:
        self.prompt_tokens_cached_total += n_cached

    def on_decode(self, busy_slots: int, prompt_tokens: int, elapsed_ms: float, max_slot_tokens: int) -> None:
        """One decode call: `busy_slots` slots processing, `prompt_tokens` of prompt in the batch."""
        self.n_decode_total += 1
        self.n_busy_slots_total += busy_slots
        self.n_tokens_max = max(self.n_tokens_max, max_slot_tokens)
        if prompt_tokens:
            self.prompt_tokens_total += prompt_tokens
            self.prompt_ms_total += elapsed_ms
            self.window_prompt_tokens += prompt_tokens
            self.window_prompt_ms += elapsed_ms

    def on_release(self, n_decoded: int, predicted_ms: float) -> None:
        self.tokens_predicted_total += n_decoded
        self.predicted_ms_total += predicted_ms
        self.window_decode_steps += max(0, n_decoded - 1)
        self.window_predicted_ms += predicted_ms

    def scrape(self, *, processing: int, deferred: int) -> str:
        """The Prometheus text of this moment; resets the rate window (every scraper shares it)."""
        values = {
            "prompt_tokens_total": self.prompt_tokens_total,
            "prompt_tokens_cached_total": self.prompt_tokens_cached_total,
            "prompt_seconds_total": self.prompt_ms_total / 1e3,
            "tokens_predicted_total": self.tokens_predicted_total,
            "tokens_predicted_seconds_total": self.predicted_ms_total / 1e3,
            "n_decode_total": self.n_decode_total,
            "n_tokens_max": self.n_tokens_max,
            "spec_decode_num_draft_tokens_total": 0,
            "spec_decode_num_accepted_tokens_total": 0,
            "spec_decode_num_drafts_total": 0,
            "prompt_tokens_seconds": _rate(self.window_prompt_tokens, self.window_prompt_ms),
            "predicted_tokens_seconds": _rate(self.window_decode_steps, self.window_predicted_ms),
            "requests_processing": processing,
            "requests_deferred": deferred,
            "n_busy_slots_per_decode": self.n_busy_slots_total / max(self.n_decode_total, 1),
        }
        self.window_prompt_tokens = self.window_decode_steps = 0
        self.window_prompt_ms = self.window_predicted_ms = 0.0
        lines = []
        for name, kind, help_text in _FAMILIES:
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {values[name]:g}"]
        return "\n".join(lines) + "\n"


def _rate(count: int, ms: float) -> float:
    return count / ms * 1e3 if count and ms > 0 else 0.0
