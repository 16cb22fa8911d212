"""How each request class fared beside the others, against running alone (a pure function).

A run of classes (run/classes.py) sends each class alone, then all together. Per class this
compares one figure's p50 in the two phases: TTFT when both levels have it (streamed), else the
request latency. A class is *slowed* when its p50 beside the others is at least `SLOWED` times its
p50 alone; the verdict then names the other class whose work held the server longest in the
together phase, by the server's own timings: Σ prompt_ms (its prefills) + Σ predicted_ms (its
answers) over its successful requests, and which of the two was the larger:

    chat TTFT p50 0.9 s alone, 11.4 s beside agent: agent's 16k-token prefills hold the 1 slot

No server timings (an OpenAI-compatible server without `timings`): the slowdown is told without a
cause. A class without the figure in a phase is told so, without a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.rundoc import LevelSummary

SLOWED = 1.5  # together / alone at or above this: the class was slowed by the others


@dataclass(frozen=True, slots=True)
class ClassPhases:
    """A class's level alone and its level beside the others (None: that phase has no level)."""

    name: str
    alone: LevelSummary | None
    together: LevelSummary | None


@dataclass(frozen=True, slots=True)
class Interference:
    """One class's verdict; `held_by` the class whose work held the slots, `held_with` "prefills"
    or "answers" (None when not slowed, or no timings say)."""

    request_class: str
    metric: str  # "TTFT" or "latency"
    alone_p50_ms: float | None
    together_p50_ms: float | None
    slowdown: float | None
    held_by: str | None
    held_with: str | None
    line: str

    def to_dict(self) -> dict[str, object]:
        return {"request_class": self.request_class, "metric": self.metric, "alone_p50_ms": self.alone_p50_ms,
                "together_p50_ms": self.together_p50_ms, "slowdown": self.slowdown, "held_by": self.held_by,
                "held_with": self.held_with, "line": self.line}


def _pair(alone_ms: float, together_ms: float) -> tuple[str, str]:
    """Both p50s in one unit, so the two read side by side: seconds when either is 1 s or more,
    except a p50 under 0.1 s, which stays in ms (it would read "0.0 s")."""
    seconds = max(alone_ms, together_ms) >= 1000

    def one(ms: float) -> str:
        return f"{ms / 1000:.1f} s" if seconds and ms >= 100 else f"{ms:.0f} ms"
    return one(alone_ms), one(together_ms)


def _tokens(n: float) -> str:
    return f"{round(n / 1000)}k" if n >= 10_000 else f"{n:,.0f}"


def _slots(slots: int | None) -> str:
    if slots is None:
        return "the slots"
    return "the 1 slot" if slots == 1 else f"the {slots} slots"


def _p50(level: LevelSummary | None, metric: str) -> float | None:
    if level is None:
        return None
    dist = level.ttft_ms if metric == "TTFT" else level.latency_ms
    return dist.p50 if dist is not None and dist.count else None


def _busy_ms(level: LevelSummary) -> tuple[float, float]:
    """(Σ prompt_ms, Σ predicted_ms) of a level's successful requests, from its means."""
    n = level.requests_ok
    return (level.prompt_ms_mean or 0.0) * n, (level.predicted_ms_mean or 0.0) * n


def interference(classes: Sequence[ClassPhases], slots: int | None) -> list[Interference]:
    """Each class's verdict (see the module docstring); none for a run of fewer than two classes."""
    if len(classes) < 2:
        return []
    out = []
    for c in classes:
        others = [o for o in classes if o.name != c.name]
        beside = " and ".join(o.name for o in others)
        metric = "TTFT" if _p50(c.alone, "TTFT") is not None and _p50(c.together, "TTFT") is not None else "latency"
        alone, together = _p50(c.alone, metric), _p50(c.together, metric)
        if alone is None or together is None:
            missing = "alone" if alone is None else f"beside {beside}"
            out.append(Interference(c.name, metric, alone, together, None, None, None,
                                    f"{c.name}: no completed request {missing}, so no comparison"))
            continue
        slowdown = together / alone if alone > 0 else None
        alone_text, together_text = _pair(alone, together)
        head = f"{c.name} {metric} p50 {alone_text} alone, {together_text} beside {beside}"
        if slowdown is not None and slowdown < SLOWED:
            out.append(Interference(c.name, metric, alone, together, slowdown, None, None,
                                    f"{head}: no interference (under {SLOWED:g}×)"))
            continue
        busy = [(sum(_busy_ms(o.together)), o) for o in others if o.together is not None]
        total, culprit = max(busy, key=lambda b: b[0], default=(0.0, None))
        if culprit is None or culprit.together is None or total <= 0:
            out.append(Interference(c.name, metric, alone, together, slowdown, None, None,
                                    f"{head}: slowed, and no server timings say by whom"))
            continue
        prefill_ms, decode_ms = _busy_ms(culprit.together)
        level = culprit.together
        if prefill_ms >= decode_ms:
            held_with, size = "prefills", level.prompt_n.mean if level.prompt_n is not None else None
        else:
            held_with, size = "answers", level.predicted_n.mean if level.predicted_n is not None else None
        sized = f"{_tokens(size)}-token {held_with}" if size else held_with
        out.append(Interference(c.name, metric, alone, together, slowdown, culprit.name, held_with,
                                f"{head}: {culprit.name}'s {sized} hold {_slots(slots)}"))
    return out
