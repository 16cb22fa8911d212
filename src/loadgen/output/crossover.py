"""The crossover verdict as `loadgen crossover` and `analyze GRID` print it: a line per level, then
the sentence (analysis/crossover.py)."""

from __future__ import annotations

from ..analysis.crossover import INCONCLUSIVE, Crossover


def crossover_lines(found: Crossover) -> list[str]:
    lines = []
    for e in found.levels:
        note = f" ({e.repeats} paired repeats)" if e.verdict == INCONCLUSIVE else ""
        lines.append(f"c={e.level:g}: {e.verdict} {e.text()}{note}")
    return [*lines, found.sentence]
