"""Saved and restored slots (`loadgen slots`): each cycle's figures and its verdict, pure.

A cycle: turn 1 on slot s (`cache_prompt: true`), the slot saved to a file, forgotten (erased, or
another conversation on it), restored, and turn 2 (turn 1's prompt, its answer and a new message)
on slot s; then a control: the slot erased and the same turn 2 sent again, re-processed.

The verdict of a cycle (`cycle_verdict`):

    failed        a step failed, the restore restored nothing, or turn 2 said no cache_n
    re-processed  the restore said n_restored > 0 but turn 2 reused fewer than P - 1 of turn 1's
                  P prompt tokens: the server re-processed what it said it restored
                  (llama.cpp #26676)
    restored      turn 2's cache_n >= P - 1 (the server always re-evaluates a prompt's last token,
                  so a turn re-sent whole reuses P - 1; turn 2, longer, reuses all the file held:
                  n_saved = P + n_predict - 1, the last answer token never entering the cache) and
                  its TTFT at most FASTER_SHARE of the control's
    not faster    cache_n says restored but TTFT is not below FASTER_SHARE of the control's

where P, turn 1's `prompt_tokens`, is its prompt_n + cache_n (what the slot held of its prompt).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

RESTORED, REPROCESSED, NOT_FASTER, FAILED = "restored", "re-processed", "not faster", "failed"
VERDICTS = (RESTORED, REPROCESSED, NOT_FASTER, FAILED)
FASTER_SHARE = 0.5  # "well below the control": a restored turn 2's TTFT at most half the re-processed one's


@dataclass(frozen=True, slots=True)
class CycleFigures:
    """What one cycle measured: turn 1's prompt in tokens (the saved prompt), the save and restore as the
    server answered them, turn 2's cache_n and TTFT, the control's (re-processed), and the file's
    bytes (read from --slot-save-dir; None: the server's n_written stands for it)."""

    slot: int
    prompt_tokens: int | None = None  # turn 1's prompt_n + cache_n
    n_saved: int | None = None
    n_written: int | None = None
    save_ms: float | None = None
    n_restored: int | None = None
    n_read: int | None = None
    restore_ms: float | None = None
    cache_n: int | None = None
    ttft_ms: float | None = None
    control_cache_n: int | None = None
    control_ttft_ms: float | None = None
    file_bytes: int | None = None
    error: str | None = None

    @property
    def bytes_per_token(self) -> float | None:
        """The saved file's bytes (the folder's, else n_written) per saved token (n_saved)."""
        size = self.file_bytes if self.file_bytes is not None else self.n_written
        return size / self.n_saved if size is not None and self.n_saved else None


def cycle_verdict(c: CycleFigures) -> tuple[str, str]:
    """(verdict, why in one sentence) of one cycle; see the module's docstring."""
    if c.error is not None:
        return FAILED, c.error
    if not c.n_restored:
        return FAILED, f"the restore restored {c.n_restored or 0} tokens"
    if c.cache_n is None or c.prompt_tokens is None:
        return FAILED, "turn 2 or turn 1 reported no timings (cache_n, prompt_n)"
    if c.cache_n < c.prompt_tokens - 1:
        return REPROCESSED, (f"the restore said n_restored {c.n_restored}, but turn 2 reused {c.cache_n} tokens "
                             f"of turn 1's {c.prompt_tokens}): re-processed (llama.cpp #26676)")
    if c.ttft_ms is not None and c.control_ttft_ms is not None and c.ttft_ms > FASTER_SHARE * c.control_ttft_ms:
        return NOT_FASTER, (f"turn 2 reused {c.cache_n} tokens, but its TTFT {c.ttft_ms:.0f} ms is not below "
                            f"{FASTER_SHARE:.0%} of the re-processed {c.control_ttft_ms:.0f} ms")
    return RESTORED, f"turn 2 reused {c.cache_n} tokens of turn 1's {c.prompt_tokens} and its answer"


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


@dataclass(frozen=True, slots=True)
class SlotsSummary:
    """The cycles of one target, counted by verdict, with the means over the cycles that have them."""

    cycles: int
    by_verdict: dict[str, int]
    save_ms: float | None
    restore_ms: float | None
    bytes_per_token: float | None
    ttft_restored_ms: float | None  # turn 2 after a restore, over the cycles judged restored
    ttft_control_ms: float | None  # the same turn 2 re-processed, over every cycle that has it

    @property
    def verdict(self) -> str:
        """The target's word: the one verdict of every cycle, else the worst present."""
        present = [v for v in (FAILED, REPROCESSED, NOT_FASTER, RESTORED) if self.by_verdict.get(v)]
        return present[0] if present else FAILED


def summarize_slots(cycles: list[CycleFigures]) -> SlotsSummary:
    verdicts = [cycle_verdict(c)[0] for c in cycles]
    restored = [c for c, v in zip(cycles, verdicts) if v == RESTORED]
    return SlotsSummary(
        cycles=len(cycles), by_verdict={v: verdicts.count(v) for v in VERDICTS if verdicts.count(v)},
        save_ms=_mean([c.save_ms for c in cycles]), restore_ms=_mean([c.restore_ms for c in cycles]),
        bytes_per_token=_mean([c.bytes_per_token for c in cycles]),
        ttft_restored_ms=_mean([c.ttft_ms for c in restored]),
        ttft_control_ms=_mean([c.control_ttft_ms for c in cycles]))
