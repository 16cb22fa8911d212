"""Does speculative decoding pay, and up to which concurrency? A pure verdict over repeated runs.

Input: per level, the throughput of each repeat of the same server with speculation on and off
(a `grid --repeat` whose template takes the server's own speculation flags as a parameter, so
they run interleaved). Per level the effect is `between_runs.run_effect` of on against off: the
ratio of geometric means and its interval, paired by repeat (each repeat ran both cells back to
back), so the machine's drift is judged as noise and never as an effect.

Per level: **pays** when the whole interval of on/off is above 1, **costs** when it is below 1,
else **inconclusive** (noise as large as the effect, or fewer than two repeats: nothing to judge
noise by). The crossover sentence reads the levels in order:
- all pay: "speculation pays at every level tested (c=1 +31% ± 4% … )";
- all cost: likewise "costs at every level tested";
- pays on the low levels, costs from some level on: "speculation pays up to c=2 (+31% ± 4%),
  costs from c=4 (−18% ± 5%)" (the last paying and the first costing level);
- anything else (an inconclusive level between, or costs then pays): "no clear crossover", with
  each level's verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .between_runs import run_effect

PAYS, COSTS, INCONCLUSIVE = "pays", "costs", "inconclusive"


@dataclass(frozen=True, slots=True)
class LevelEffect:
    level: int | float
    verdict: str  # PAYS, COSTS or INCONCLUSIVE
    change: float | None  # on/off − 1 (geometric means), e.g. 0.31 for +31%
    half_width: float | None  # half the interval of the change, e.g. 0.04 for ± 4%
    repeats: int

    def text(self) -> str:
        if self.change is None:
            return "n/a"
        sign = "+" if self.change >= 0 else "−"
        spread = f" ± {self.half_width * 100:.0f}%" if self.half_width is not None else ""
        return f"{sign}{abs(self.change) * 100:.0f}%{spread}"

    def to_dict(self) -> dict[str, object]:
        return {"level": self.level, "verdict": self.verdict, "change": self.change, "half_width": self.half_width,
                "repeats": self.repeats}


@dataclass(frozen=True, slots=True)
class Crossover:
    levels: list[LevelEffect]
    sentence: str
    pays_up_to: int | float | None  # the last level of the paying run from the lowest level
    costs_from: int | float | None  # the first level of the costing run to the highest level

    def to_dict(self) -> dict[str, object]:
        return {"verdict": self.sentence, "pays_up_to": self.pays_up_to, "costs_from": self.costs_from,
                "levels": [lv.to_dict() for lv in self.levels]}


def level_effect(level: int | float, on: Sequence[float], off: Sequence[float], confidence: float = 0.95) -> LevelEffect:
    """One level's verdict from its repeats' throughputs (repeat i of `on` paired with repeat i of `off`)."""
    effect = run_effect(off, on, 1 - confidence, paired=True)
    if effect.ratio is None:
        return LevelEffect(level, INCONCLUSIVE, None, None, min(len(on), len(off)))
    change = effect.ratio - 1
    if effect.ci_low is None or effect.ci_high is None:
        return LevelEffect(level, INCONCLUSIVE, change, None, min(len(on), len(off)))
    verdict = PAYS if effect.ci_low > 1 else COSTS if effect.ci_high < 1 else INCONCLUSIVE
    return LevelEffect(level, verdict, change, (effect.ci_high - effect.ci_low) / 2, min(len(on), len(off)))


def crossover(on: Mapping[int | float, Sequence[float]], off: Mapping[int | float, Sequence[float]],
              confidence: float = 0.95, name: str = "c=") -> Crossover:
    """The verdict over the levels both sides ran (see the module docstring)."""
    effects = [level_effect(lv, on[lv], off[lv], confidence) for lv in sorted(set(on) & set(off))]
    verdicts = [e.verdict for e in effects]

    def at(e: LevelEffect) -> str:
        return f"{name}{e.level:g} {e.text()}"

    if not effects:
        return Crossover([], "no level ran with speculation both on and off", None, None)
    if all(v == PAYS for v in verdicts):
        return Crossover(effects, "speculation pays at every level tested (" + ", ".join(map(at, effects)) + ")",
                         effects[-1].level, None)
    if all(v == COSTS for v in verdicts):
        return Crossover(effects, "speculation costs at every level tested (" + ", ".join(map(at, effects)) + ")",
                         None, effects[0].level)
    paying = next((i for i, v in enumerate(verdicts) if v != PAYS), len(verdicts))
    costing = paying
    if 0 < paying < len(verdicts) and all(v == COSTS for v in verdicts[costing:]):
        last, first = effects[paying - 1], effects[costing]
        return Crossover(effects, f"speculation pays up to {at(last)}, costs from {at(first)}", last.level,
                         first.level)
    return Crossover(effects, "no clear crossover: " + ", ".join(f"{at(e)} {e.verdict}" for e in effects),
                     effects[paying - 1].level if paying > 0 else None, None)
