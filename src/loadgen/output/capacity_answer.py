"""`loadgen capacity`'s answer as capacity.json and the verdict sentence say it: from the search's
probes as it ran (kinds/capacity/command.py), or rebuilt from a run folder's run.json when capacity.json is
missing (`probes_of_run`, cli/analyze.py): the same pure functions over the same levels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..analysis.capacity_search import (
    DEFAULT_NOISE,
    DEFAULT_REPEAT,
    FRESH_RUN_CONFIDENCE,
    Answer,
    CapacitySettings,
    Probe,
    conclude,
    why,
)
from ..analysis.open_loop import AT_LIMIT, OVERLOADED
from ..analysis.slo import TARGETS, Slo, SloLevel
from ..core.rundoc import Level, RunDocument, RunKind, SloJudgement
from ..results.schema import CAPACITY_FILE


class _Answer(msgspec.Struct):
    verdict: str | None = None


class _CapacityFile(msgspec.Struct):
    """What a reader takes of capacity.json: the answer's sentence."""

    capacity: _Answer


def answer_line(path: Path, doc: RunDocument) -> str | None:
    """A capacity run's answer as `analyze` and `report` say it: capacity.json's sentence, or when that
    file is missing the answer rebuilt from run.json's levels and --slo, said to be rebuilt; None for
    a run of another command (or one whose answer cannot be rebuilt: no --slo)."""
    settings = settings_of_run(doc)
    if settings is None:
        return None
    try:
        saved = msgspec.json.decode((path / CAPACITY_FILE).read_bytes(), type=_CapacityFile).capacity.verdict
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        saved = None
    if isinstance(saved, str):
        return saved
    rebuilt = rebuilt_capacity(doc, settings)
    if rebuilt is None:
        return None
    return f"{msgspec.convert(rebuilt, _Answer).verdict} (rebuilt from run.json: {CAPACITY_FILE} is missing or unreadable)"


def probes_of_run(doc: RunDocument) -> dict[int | float, list[Probe]]:
    """Each level's probes as the search made them, from run.json (its one target's levels, a repeated
    level once per run, each judged by --slo): passed, score and ratios from the level's `slo`; at a
    rate, one the server did not keep up with (its open-loop verdict) fails (run/capacity.py's
    `probe_of`). Levels without a judgement are left out."""
    target = doc.targets[0] if doc.targets else None
    if target is None:
        return {}
    kept = {v.level: v.open_loop.verdict for v in (target.verdict.levels if target.verdict else [])
            if v.open_loop is not None}
    history: dict[int | float, list[Probe]] = {}
    for lv in target.levels:
        if lv.slo is None or lv.stopped_reason:
            continue
        judged = msgspec.convert(lv.slo, SloLevel)
        open_loop = kept.get(lv.level) if lv.rate is not None else None
        history.setdefault(lv.level, []).append(Probe(
            level=lv.level, passed=judged.passed and open_loop not in (OVERLOADED, AT_LIMIT), score=judged.score,
            ratio=dict(judged.ratio), attainment=judged.attainment, open_loop=open_loop, judged=judged.judged,
            required=judged.required))
    return history


def _unit(by_rate: bool, level: int | float, users: bool = False) -> str:
    if by_rate:
        return f"{level:g} req/s"
    return f"{level:g} concurrent user{'s' if level != 1 else ''}" if users else f"{level:g}"


PROBE_FIELDS = ("passed", "attainment", "score", "goodput_req_s", "goodput_tok_s", "most_missed")  # of SloLevel


def _probe(level: Level, decision: str | None) -> dict[str, Any]:
    """A probed level in capacity.json: its level, how --slo judged it, and the search's decision."""
    judged = msgspec.convert(level.slo, SloLevel) if level.slo else None
    return {"level": level.level, **{name: getattr(judged, name, None) for name in PROBE_FIELDS}, "decision": decision}


def capacity_document(answer: Answer, doc: RunDocument | dict[str, Any], slo: Slo | None, settings: CapacitySettings,
                      history: Mapping[int | float, Sequence[Probe]], ended: str | None,
                      cut_short: bool = False) -> dict[str, Any]:
    """capacity.json's content (and --format json's): the answer, every probe, and the verdict sentence.
    `history`: each level's probes (the search's, or `probes_of_run`'s); `ended`: why the search ended;
    `cut_short`: the run stopped it (a signal, the server, a level that stopped)."""
    assert slo is not None
    run = RunDocument.of(doc)
    target = run.targets[0] if run.targets else None
    summaries = target.levels if target else []
    verdict_levels = target.verdict.levels if target and target.verdict else []
    total_slots = target.server.total_slots if target and target.server else None
    by_rate = settings.by_rate

    def summary_at(level: int | float | None) -> Level | None:
        return next((lv for lv in summaries if lv.level == level), None)

    # the level whose failure is explained: the first that did not pass, or past an inconclusive one the first failure
    hi = answer.bracket_hi
    if hi in answer.inconclusive and answer.infeasible_min is not None:
        hi = answer.infeasible_min
    hi_verdict = next((v for v in verdict_levels if v.level == hi), None)
    reason = _not_kept_up(history, hi) or why(answer.binding, summary_at(answer.feasible_max), summary_at(hi),
                                             hi_verdict, total_slots)
    seed = run.config.arrival_seed if run.config is not None and run.config.arrival_seed is not None else 0
    runs: dict[int | float, int] = {}
    levels = []
    for lv in summaries:
        repeat = runs[lv.level] = runs.get(lv.level, -1) + 1
        probes = history.get(lv.level, [])
        levels.append({**_probe(lv, answer.decisions.get(lv.level)),
                       **({"arrival_seed": seed + repeat,
                           "open_loop": probes[repeat].open_loop if repeat < len(probes) else None} if by_rate else {})})
    return {
        "feasible_max": answer.feasible_max, "infeasible_min": answer.infeasible_min,
        "binding": answer.binding, "inconclusive": list(answer.inconclusive), "shape": answer.shape,
        "why": reason or None, "by": "rate" if by_rate else "concurrency", "slo": slo.to_dict(),
        "settings": settings.to_dict(), "requests": sum(lv.requests_ok + lv.requests_failed for lv in summaries),
        "wall_s": sum(lv.wall_s for lv in summaries), "ended": ended, "levels": levels,
        "verdict": verdict_sentence(answer, slo, by_rate, _judged(summary_at(hi)), reason, settings, ended, cut_short),
    }


def _not_kept_up(history: Mapping[int | float, Sequence[Probe]], level: int | float | None) -> str:
    """Why a rate failed when the server did not keep up with it (its probes' open-loop verdicts)."""
    probes = history.get(level, []) if level is not None else []
    behind = [p.open_loop for p in probes if p.open_loop in ("overloaded", "at_limit")]
    if not behind:
        return ""
    return (f"it did not keep up with the offered rate in {len(behind)} of {len(probes)} run"
            f"{'s' if len(probes) != 1 else ''}: its queue grew through the level "
            f"({', '.join(sorted(set(b.replace('_', ' ') for b in behind)))})")


def _judged(level: Level | None) -> SloJudgement | None:
    return level.slo_judgement if level is not None else None


def verdict_sentence(answer: Answer, slo: Slo, by_rate: bool, hi_judged: SloJudgement | None, reason: str,
                     settings: CapacitySettings, ended: str | None, cut_short: bool = False) -> str:
    """"serves 3 concurrent users within ttft≤500 ms, tpot≤50 ms for 90% of requests; at 4 TTFT p90 is
    612 ms because its 3 slots are full and requests queue (median 410 ms)". A search the run cut short
    (`cut_short`: a signal, the server, a level that stopped) says so, and why (`ended`)."""
    sentence = _verdict(answer, slo, by_rate, hi_judged, reason, settings, ended)
    if cut_short and ended and ended not in sentence:
        sentence += f"; the search was cut short: {ended}"
    return sentence


def _verdict(answer: Answer, slo: Slo, by_rate: bool, hi_judged: SloJudgement | None, reason: str,
             settings: CapacitySettings, ended: str | None) -> str:
    within = f"within {slo.text()} for {slo.attainment:.0%} of requests"
    lo, hi = answer.feasible_max, answer.bracket_hi
    if hi is None:
        if lo is None:
            return f"no level finished ({ended or 'stopped'}): no answer"
        limit = "the most allowed (--max-concurrency)" if lo >= settings.max_level else f"the search stopped: {ended}"
        return f"serves {_unit(by_rate, lo, users=True)} {within}; no level failed up to {_unit(by_rate, lo)} ({limit})"
    head = (f"serves {_unit(by_rate, lo, users=True)} {within}" if lo is not None
            else f"cannot serve even {_unit(by_rate, hi, users=True)} {within}")
    if hi in answer.inconclusive:
        fail = answer.infeasible_min
        if lo is None:
            head = (f"whether it serves even {_unit(by_rate, hi, users=True)} {within} cannot be told: its repeats "
                    f"disagree (inconclusive at this noise)")
        elif hi in answer.unsteady:
            head += (f"; {_unit(by_rate, hi)} passed on every schedule but would miss the target too often on a "
                     f"fresh one (its attainments' {FRESH_RUN_CONFIDENCE:.0%} prediction bound is below {slo.attainment:.0%}), so the "
                     f"capacity is between {_unit(by_rate, lo)} and {_unit(by_rate, hi)}")
        else:
            head += (f"; {_unit(by_rate, hi)} is inconclusive at this noise (its repeats disagree), so the capacity "
                     f"is between {_unit(by_rate, lo)} and {_unit(by_rate, hi)}")
        if fail is None:
            return head
        hi = fail
    value = ""
    binding = answer.binding
    q = f"p{slo.attainment * 100:g}"
    ratio = hi_judged.ratio.get(binding) if hi_judged is not None and binding else None
    targets = dict(slo.targets_ms)
    if binding in targets and isinstance(ratio, (int, float)):
        value = f" {binding.upper() if binding != 'queue' else 'queue wait'} {q} is {ratio * targets[binding]:,.0f} ms"
    elif binding == "error":
        value = " requests fail"
    shape = f" ({answer.shape})" if answer.shape else ""
    because = f" because {reason}" if reason and binding != "error" else (f": {reason}" if reason else "")
    return f"{head}; at {_unit(by_rate, hi)}{value}{because}{shape}"


# run.json's "command" is the argv that made the run: the search's settings are its options, with
# kinds/capacity/command.py's defaults (--budget only stops the search; it changes no decision).
_SETTING_FLAGS = {"--by": "by", "--max-concurrency": "max_level", "--start": "start", "--repeat": "repeat",
                  "--noise": "noise"}


class _GivenSettings(msgspec.Struct):
    """The search's settings as a capacity command line gave them (text read as numbers)."""

    by: str = "concurrency"
    max_level: float = 64
    start: float = 1
    repeat: int = DEFAULT_REPEAT
    noise: float = DEFAULT_NOISE


def settings_of_run(doc: RunDocument) -> CapacitySettings | None:
    """A capacity run's search settings: run.json's config "capacity" (schema 4 on), else read from
    the command line of an older run (`settings_of_command`); None for a run of another command."""
    stored = doc.config.capacity if doc.config is not None else None
    if stored is None:
        return settings_of_command(doc.command) if doc.kind in (RunKind.CAPACITY, RunKind.SWEEP) else None
    by_rate = stored.by == "rate"
    return CapacitySettings(by_rate=by_rate, max_level=stored.max_level if by_rate else int(stored.max_level),
                            start=stored.start if by_rate else int(stored.start), repeat=stored.repeat,
                            noise=stored.noise, budget_requests=stored.budget_requests, budget_s=stored.budget_s,
                            hold_s=stored.hold_s)


def settings_of_command(command: Sequence[str] | None) -> CapacitySettings | None:
    """The search's settings from a run's argv (`loadgen capacity ...`); None when another command made
    the run or an option cannot be read."""
    if not command or len(command) < 2 or command[1] != "capacity":
        return None
    given: dict[str, str] = {}
    args = list(command[2:])
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in _SETTING_FLAGS:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            given[_SETTING_FLAGS[flag]] = value
    try:
        read = msgspec.convert(given, _GivenSettings, strict=False)
    except msgspec.ValidationError:
        return None
    by_rate, max_level, start, repeat, noise = read.by == "rate", read.max_level, read.start, read.repeat, read.noise
    return CapacitySettings(by_rate=by_rate, max_level=max_level if by_rate else int(max_level),
                            start=start if by_rate else int(start), repeat=repeat, noise=noise,
                            at_least="--at-least" in args,
                            hold_s=None)  # runs before --hold judged a fresh run as long as a level


def rebuilt_capacity(doc: RunDocument, settings: CapacitySettings) -> dict[str, Any] | None:
    """capacity.json's content rebuilt from run.json (its levels judged by the config's --slo): the
    same answer and verdict the search gave, save why it ended, which only capacity.json kept. None
    without the run's --slo."""
    targets = doc.config.slo_targets if doc.config is not None else None
    if targets is None or not targets.targets_ms:
        return None
    slo = Slo(tuple((name, targets.targets_ms[name]) for name in TARGETS if name in targets.targets_ms),
              targets.attainment)
    history = probes_of_run(doc)
    answer = conclude(history, settings.repeat, settings.noise, settings.by_rate, settings.hold_s)
    return capacity_document(answer, doc, slo, settings, history, "not recorded (capacity.json is missing)")
