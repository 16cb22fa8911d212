"""A grid of server configurations: the cells, their order, and what the cells' runs add up to.

Pure functions. A grid is a server command template with `{name}` placeholders and, per name, a
list of values (`--param parallel=1,2,4`); the cells are every combination (the first parameter
varies slowest, as llama-bench crosses its lists). With `--repeat N` the cells run interleaved
(A B C, A B C, ...), so a slow drift of the machine spreads over every cell instead of falling on
the last ones. The summary is computed from each cell's run documents (run.json of a sweep).
"""

from __future__ import annotations

import itertools
import shlex
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import msgspec

from ..core.errors import ConfigError
from ..core.griddoc import BootEntry, CacheCapacityEntry, CapacityEntry, GridRun, KvEstimateEntry
from ..core.rundoc import Level, PrefillRow, RunDocument
from .env_drift import changed_levels, environment_differences
from .grid_capacity import CellCapacity, best_cell, cell_capacity, cell_held
from .metrics import MeanSd, mean_sd


@dataclass(frozen=True, slots=True)
class GridParam:
    name: str
    values: tuple[str, ...]


def parse_param(text: str) -> GridParam:
    """"parallel=1,2,4" -> GridParam("parallel", ("1", "2", "4"))."""
    name, sep, values = text.partition("=")
    items = tuple(v.strip() for v in values.split(","))
    if not sep or not name.strip().isidentifier() or not all(items):
        raise ConfigError(f"--param {text!r}: write NAME=V1,V2,... (e.g. parallel=1,2,4)")
    if len(set(items)) != len(items):
        raise ConfigError(f"--param {text!r} repeats a value")
    return GridParam(name.strip(), items)


def placeholders(template: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"--server: {exc} (a literal brace is written {{{{ or }}}})") from None


# Placeholders grid fills itself for every cell: a free loopback port (from --port-range when given)
# and the address it binds, for a server whose flags are not llama-server's --port/--host.
FILLED = ("port", "host")


def check_template(template: str, params: Sequence[GridParam]) -> None:
    """Every placeholder has a --param (or is one grid fills, FILLED) and every --param a
    placeholder; names are given once."""
    names = [p.name for p in params]
    used = placeholders(template)
    if "" in used or any(not n.isidentifier() for n in used):
        raise ConfigError("--server: placeholders are names, e.g. {parallel}")
    filled = next((n for n in names if n in FILLED), None)
    if filled:
        raise ConfigError(f"--param {filled}: grid fills {{{filled}}} itself for each cell (a free loopback "
                          "port; --port-range chooses where)")
    used -= set(FILLED)
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"--param {dup} is given twice; list its values once: {dup}=A,B")
    missing = sorted(used - set(names))
    if missing:
        raise ConfigError(f"--server uses {{{missing[0]}}} but no --param {missing[0]}=... gives its values")
    unused = sorted(set(names) - used)
    if unused:
        raise ConfigError(f"--param {unused[0]} is not used in --server (write {{{unused[0]}}} where it goes)")


def cross(params: Sequence[GridParam]) -> list[dict[str, str]]:
    """Every combination of the values, the first parameter varying slowest."""
    return [dict(zip([p.name for p in params], combo)) for combo in itertools.product(*(p.values for p in params))]


def run_order(n_cells: int, repeat: int) -> list[tuple[int, int]]:
    """(repeat number from 1, cell index) in the order they run: every cell once, then again."""
    return [(r, c) for r in range(1, repeat + 1) for c in range(n_cells)]


def render(template: str, values: dict[str, str], port: str = "0", host: str = "127.0.0.1") -> list[str]:
    """The server's argv for one cell: its --param values, and grid's own `port` and `host` where
    the template writes {port} and {host} (FILLED)."""
    try:
        return shlex.split(template.format_map({**values, "port": port, "host": host}))
    except (ValueError, LookupError, AttributeError) as exc:  # a field ({a.b}, {a[0]}) no --param gives
        raise ConfigError(f"--server: {exc}") from None


def cell_name(values: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items()) or "server"


def short_value(value: str) -> str:
    """A value as a cell's name shows it: a path (it has a "/" or a file suffix like .gguf) by its
    file's stem, as sweeps name a model by its file; any other value as given."""
    if "/" in value or value.lower().endswith((".gguf", ".bin", ".safetensors")):
        return PurePath(value).stem or value
    return value


def short_params(cells: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Each cell's parameters as its name and the grid table show them (`short_value`); a parameter
    whose short values would collide (two models called x.gguf in two folders) keeps its values
    whole, so cells stay told apart."""
    whole = {name for name in (cells[0] if cells else {})
             if len({short_value(c.get(name, "")) for c in cells}) < len({c.get(name, "") for c in cells})}
    return [{k: v if k in whole else short_value(v) for k, v in c.items()} for c in cells]


def cell_names(cells: Sequence[dict[str, str]]) -> list[str]:
    """Each cell's name from its short parameters (`short_params`)."""
    return [cell_name(values) for values in short_params(cells)]


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last of `names` in argv (`-c 2048` or `--ctx-size=2048`), or None."""
    found = None
    for i, arg in enumerate(argv):
        head, eq, tail = arg.partition("=")
        if arg in names and i + 1 < len(argv):
            found = argv[i + 1]
        elif eq and head in names:
            found = tail
    return found


def has_flag(argv: Sequence[str], *names: str) -> bool:
    return any(arg in names or arg.partition("=")[0] in names for arg in argv)


@dataclass(frozen=True, slots=True)
class ServerCacheFlags:
    """What a llama-server command line says about its caches (llama-server's defaults where unset)."""

    model: str | None
    n_ctx: int  # 0: the model's trained context
    n_parallel: int
    unified: bool
    type_k: str = "f16"
    type_v: str = "f16"
    n_ubatch: int = 512
    swa_full: bool = False
    n_batch: int = 2048
    flash_attn: str = "auto"


def cache_flags(argv: Sequence[str]) -> ServerCacheFlags:
    """-c, -np, -kvu/-no-kvu, -ctk, -ctv, -ub, -b, -fa, --swa-full and -m of a llama-server argv. Unset
    --parallel is llama-server's auto: 4 slots sharing one unified cache."""
    parallel = int(flag_value(argv, "-np", "--parallel") or -1)
    unified = has_flag(argv, "-kvu", "--kv-unified") or (parallel < 0 and not has_flag(argv, "-no-kvu",
                                                                                        "--no-kv-unified"))
    return ServerCacheFlags(
        model=flag_value(argv, "-m", "--model"), n_ctx=int(flag_value(argv, "-c", "--ctx-size") or 0),
        n_parallel=4 if parallel < 0 else parallel, unified=unified,
        type_k=(flag_value(argv, "-ctk", "--cache-type-k") or "f16").lower(),
        type_v=(flag_value(argv, "-ctv", "--cache-type-v") or "f16").lower(),
        n_ubatch=int(flag_value(argv, "-ub", "--ubatch-size") or 512), swa_full=has_flag(argv, "--swa-full"),
        n_batch=int(flag_value(argv, "-b", "--batch-size") or 2048),
        flash_attn=(flag_value(argv, "-fa", "--flash-attn") or "auto").lower())


@dataclass(frozen=True, slots=True)
class CellSummary:
    """One cell over its repeats: throughput and latency per level as mean ± sd."""

    name: str
    params: dict[str, str]
    runs_ok: int
    runs: int
    failure: str | None  # the last failed run's reason
    single_stream_tok_s: MeanSd | None  # throughput at the lowest level
    peak_tok_s: MeanSd | None  # each run's best level, averaged
    peak_at: int | float | None  # the level most runs peaked at
    saturated_at: int | float | None
    throughput_by_level: dict[Any, MeanSd] = field(default_factory=dict)
    latency_by_level: dict[Any, MeanSd] = field(default_factory=dict)  # mean latency_ms per level
    kv_logged_mib: float | None = None
    kv_estimate_mib: float | None = None
    n_slots: int | None = None
    kv_unified: bool | None = None
    recurrent_logged_mib: float | None = None
    recurrent_estimate_mib: float | None = None
    kv_estimate_note: str | None = None  # why `loadgen kv` gave this cell no figure
    measure: str = "sweep"  # what ran against the cell: sweep, prefill, depth, capacity or cache-capacity
    prompt_tok_s_by_length: dict[int, MeanSd] = field(default_factory=dict)  # prefill: per prompt length
    ttft_by_length: dict[int, MeanSd] = field(default_factory=dict)  # prefill: client TTFT ms per length
    decode_by_depth: dict[int, MeanSd] = field(default_factory=dict)  # depth: decode tok/s per depth
    # Each run's lowest gross J per output token over its levels (analysis/energy.py: the "total"
    # source, else the only one), averaged; None without energy counters.
    least_j_per_token: MeanSd | None = None
    capacity: CellCapacity | None = None  # --measure capacity: the answers of the runs that finished ok
    binding: str | None = None  # capacity: the target that bound most runs' answers
    # cache-capacity: the warm conversations predicted from the slots and --cache-ram (the runs' first)
    predicted_held: int | None = None
    # The runs that finished ok, as read: what `machine_lines` compares between cells.
    run_docs: tuple[RunDocument, ...] = field(default=(), compare=False, repr=False)


def step_means(doc: RunDocument | dict[str, Any], key: str) -> dict[int, float]:
    """A prefill or depth run's mean of `key` (prompt_tok_s, ttft_ms, decode_tok_s) per prompt length
    or depth, from its first target's rows; rows skipped or without the figure are left out."""
    doc = RunDocument.of(doc)
    if doc.kind.kind.figure is None or not doc.targets:  # not a kind of a table of rows
        return {}
    section = doc.targets[0].section(doc.kind)
    means: dict[int, float] = {}
    for row in getattr(section, "rows", None) or []:
        size = row.prompt_tokens if isinstance(row, PrefillRow) else row.depth
        figure = getattr(row, key, None)
        if not row.skipped and figure is not None:
            means[size] = figure.mean
    return means


def run_line(doc: RunDocument | dict[str, Any]) -> str:
    """One finished cell run in a line: "prompt tok/s 5,120.3 at 64, 4,980.1 at 256" (prefill),
    "decode tok/s 51.2 at 0, 48.0 at 128" (depth), "12.3 tok/s at 1, 20.1 at 2" (sweep levels)."""
    doc = RunDocument.of(doc)
    figure = doc.kind.kind.figure  # a kind of a table of rows: the figure its rows are summarised by
    if figure is not None:
        key, what = figure
        means = step_means(doc, key)
        return f"{what} " + ", ".join(f"{v:,.1f} at {n}" for n, v in means.items()) if means else "no figures"
    return ", ".join(f"{lv.throughput_tok_s:.1f} tok/s at {lv.level}" for lv in _levels(doc)) or "no levels"


def _by_size(docs: Sequence[RunDocument], key: str) -> dict[int, MeanSd]:
    """Each run's mean per prompt length or depth, as mean ± sd over the runs."""
    values: dict[int, list[float]] = {}
    for doc in docs:
        for size, mean in step_means(doc, key).items():
            values.setdefault(size, []).append(mean)
    return {size: ms for size, vs in sorted(values.items()) if (ms := mean_sd(vs)) is not None}


def _levels(doc: RunDocument) -> list[Level]:
    """The first target's levels (a cell has one target)."""
    return list(doc.targets[0].levels) if doc.targets else []


def level_j_per_token(level: Level) -> float | None:
    """A level's gross J per output token: its "total" energy, else its only source's; None without."""
    pick = level.headline_energy
    return None if pick is None else pick.j_per_token


@dataclass(frozen=True, slots=True)
class CellRun:
    """One run of a cell as its summary reads it: its grid entry and its run.json (None: it has
    none, or it is unreadable)."""

    entry: GridRun
    run: RunDocument | None = None

    @classmethod
    def of(cls, entry: CellRun | GridRun | Mapping[str, Any],
           run: RunDocument | dict[str, Any] | None = None) -> CellRun:
        """A grid entry and its run.json; or a grid entry's content with its run.json as `run` (a
        hand-written one: its repeat is not read here, and may be left out)."""
        if isinstance(entry, CellRun):
            return entry
        if isinstance(entry, Mapping):
            content = dict(entry)
            run = content.pop("run", None)
            entry = msgspec.convert({"repeat": 1, **content}, GridRun, strict=False)
        return cls(entry, RunDocument.of(run) if run else None)


def summarize_cell(name: str, params: dict[str, str], runs: Sequence[CellRun | Mapping[str, Any]]) -> CellSummary:
    """`runs`: the cell's grid entries, each with (when it ran) its run.json."""
    cell_runs = [CellRun.of(r) for r in runs]
    docs = [r.run for r in cell_runs if r.entry.status == "ok" and r.run is not None]
    by_level: dict[Any, list[float]] = {}
    lat_by_level: dict[Any, list[float]] = {}
    peaks, peak_levels, saturated, least_j = [], [], [], []
    for doc in docs:
        levels = _levels(doc)
        per_token = [j for lv in levels if (j := level_j_per_token(lv)) is not None]
        if per_token:
            least_j.append(min(per_token))
        for lv in levels:
            by_level.setdefault(lv.level, []).append(lv.throughput_tok_s)
            if lv.latency_ms is not None:
                lat_by_level.setdefault(lv.level, []).append(lv.latency_ms.mean)
        if levels:
            best = max(levels, key=lambda lv: lv.throughput_tok_s)
            peaks.append(best.throughput_tok_s)
            peak_levels.append(best.level)
        verdict = doc.targets[0].verdict if doc.targets else None
        saturated.append(None if verdict is None else verdict.saturated_at)
    throughput = {lv: ms for lv, vs in sorted(by_level.items()) if (ms := mean_sd(vs)) is not None}
    # the first run that has each (a run whose figures are all absent has none)
    boot = next((b for r in cell_runs if (b := r.entry.boot) is not None and b != BootEntry()), BootEntry())
    estimate = next((e for r in cell_runs if (e := r.entry.kv_estimate) is not None and e != KvEstimateEntry()),
                    None)
    note = next((r.entry.kv_estimate_note for r in cell_runs if r.entry.kv_estimate_note), None)
    failed = [r.entry for r in cell_runs if r.entry.status != "ok"]
    answers = [r.entry.capacity for r in cell_runs if r.entry.status == "ok" and r.entry.capacity is not None]
    held = [r.entry.cache_capacity for r in cell_runs if r.entry.status == "ok" and r.entry.cache_capacity is not None]
    bindings = [a.binding for a in answers if a.binding]
    return CellSummary(
        name=name, params=params, runs_ok=len(held) if held else len(docs), runs=len(runs),
        failure=failed[-1].reason if failed else None,
        single_stream_tok_s=throughput[min(throughput)] if throughput else None,
        peak_tok_s=mean_sd(peaks), peak_at=max(set(peak_levels), key=peak_levels.count) if peak_levels else None,
        saturated_at=max(set(saturated), key=saturated.count) if saturated else None,
        throughput_by_level=throughput,
        latency_by_level={lv: ms for lv, vs in sorted(lat_by_level.items()) if (ms := mean_sd(vs)) is not None},
        kv_logged_mib=boot.kv_size_mib, kv_estimate_mib=estimate.kv_mib if estimate else None,
        n_slots=boot.n_slots, kv_unified=boot.kv_unified, recurrent_logged_mib=boot.recurrent_mib,
        recurrent_estimate_mib=estimate.recurrent_mib if estimate else None,
        kv_estimate_note=None if estimate else note, least_j_per_token=mean_sd(least_j),
        measure=_measure(answers, held, docs),
        capacity=cell_capacity(name, answers) if answers else cell_held(name, held) if held else None,
        predicted_held=next((h.predicted_capacity for h in held if h.predicted_capacity is not None), None),
        binding=max(bindings, key=bindings.count) if bindings else None,
        prompt_tok_s_by_length=_by_size(docs, "prompt_tok_s"), ttft_by_length=_by_size(docs, "ttft_ms"),
        decode_by_depth=_by_size(docs, "decode_tok_s"), run_docs=tuple(docs))


def machine_lines(cells: Sequence[CellSummary]) -> list[str]:
    """One line per way the machine under the cells differed (analysis/env_drift.py): each cell's
    recorded environment against the first cell's (a link generation, a power limit, a governor:
    what `compare` would refuse), and each level of a cell whose machine changed during it. The
    flags and boot decisions that differ between cells are the grid's point, so they are not said."""
    measured = [c for c in cells if c.run_docs]
    lines: list[str] = []
    for cell in measured[1:]:
        differences, _ = environment_differences(measured[0].run_docs, cell.run_docs)
        lines += [f"{cell.name} against {measured[0].name}: {d}" for d in differences]
    for cell in measured:
        lines += [f"{cell.name}: the machine changed during {line}" for line in changed_levels(cell.run_docs)]
    return list(dict.fromkeys(lines))  # a difference inside the first cell's repeats is said once


def _measure(answers: Sequence[CapacityEntry], held: Sequence[CacheCapacityEntry], docs: Sequence[RunDocument]) -> str:
    """What ran against a cell, from what its runs left: capacity answers, cache-capacity results, or
    a prefill's, depth's or sweep's run.json."""
    if answers:
        return "capacity"
    if held:
        return "cache-capacity"
    return next((d.kind.value for d in docs if d.kind.kind.figure is not None), "sweep")


def kv_warnings(cells: Sequence[CellSummary]) -> list[str]:
    """One line per cell whose boot log and `loadgen kv` disagree to the hundredth of a MiB (the KV
    caches, sliding-window ones included, and the recurrent state), with both figures; or for which
    `loadgen kv` gave no figure (its reason). The boot log is what the server allocated."""
    lines = []
    for c in cells:
        for what, logged, est in (("KV cache", c.kv_logged_mib, c.kv_estimate_mib),
                                  ("recurrent state", c.recurrent_logged_mib, c.recurrent_estimate_mib)):
            if logged is not None and est is not None and f"{logged:.2f}" != f"{est:.2f}":
                lines.append(f"{c.name}: the boot log's {what} is {logged:.2f} MiB but loadgen kv estimated "
                             f"{est:.2f} MiB; the log is what the server allocated")
        if c.kv_estimate_note and c.kv_logged_mib is not None:
            lines.append(f"{c.name}: the boot log's KV cache is {c.kv_logged_mib:.2f} MiB; loadgen kv gave no "
                         f"figure ({c.kv_estimate_note})")
    return lines


UNTESTED = "no spread to test it against; use --repeat 2 or more"


def _untested(compared: Sequence[tuple[MeanSd, CellSummary]],
              ranked: Sequence[tuple[MeanSd, CellSummary]]) -> str | None:
    """Why a lead between the `compared` cells cannot be tested: one of their values is a single
    run's (no sd); "one run per cell" when every ranked cell's is. None when all have a spread."""
    single = [cell for value, cell in compared if value.sd is None]
    if not single:
        return None
    if all(value.sd is None for value, _ in ranked):
        return f"untested: one run per cell, so {UNTESTED}"
    return f"untested: {single[0].name} has one run, so {UNTESTED}"


def _clear_lead(best: MeanSd, second: MeanSd, higher: bool) -> bool:
    """With repeats, a lead counts only when the two cells' mean ± sd do not overlap (both have an sd)."""
    best_sd, second_sd = best.sd or 0.0, second.sd or 0.0
    if higher:
        return best.mean - best_sd > second.mean + second_sd
    return best.mean + best_sd < second.mean - second_sd


def _leader(cells: Sequence[CellSummary], level: int | float) -> CellSummary:
    """The cell with the highest mean throughput at `level` (every one of `cells` measured it)."""
    return max(cells, key=lambda c: c.throughput_by_level[level].mean)


def _winner(cells: Sequence[CellSummary], value: Any, higher: bool = True, digits: int = 0) -> str | None:
    """"parallel=2 (25.0; +19% against the worst)", with why the lead is untested (a single run)
    or that it is within the repeats' spread of the next."""
    ranked = sorted(((v, c) for c in cells if (v := value(c)) is not None), key=lambda vc: vc[0].mean,
                    reverse=higher)
    if not ranked:
        return None
    (best, cell), rest = ranked[0], ranked[1:]
    if not rest:
        return f"{cell.name} ({best.mean:,.1f})"
    worst = ranked[-1][0].mean
    share = (best.mean / worst - 1) if higher and worst > 0 else (1 - best.mean / worst if worst > 0 else 0)
    second = rest[0][0]
    untested = _untested(ranked[:2], ranked)
    noise = f"; {untested}" if untested else "" if _clear_lead(best, second, higher) else \
        ", within the repeats' spread of the next"
    return f"{cell.name} ({best.mean:,.1f}; {share:+.0%} against the worst{noise})" if higher else \
        f"{cell.name} ({best.mean:,.{digits}f}; {share:.0%} lower than the worst{noise})"


def who_wins(cells: Sequence[CellSummary]) -> list[str]:
    """One line per question: which cell wins on single-stream speed, peak throughput, every level's
    throughput and the top level's latency. A lead between cells of a single run each is said to be
    untested (no spread to test it against); with repeats, one inside the spread is said so."""
    if any(c.measure in ("capacity", "cache-capacity") for c in cells):
        return [best_cell([c.capacity or CellCapacity(c.name, ()) for c in cells]).sentence]
    ok = [c for c in cells if c.runs_ok]
    if len(ok) < 2:
        return []
    if any(c.measure != "sweep" for c in ok):
        return _who_wins_by_size(ok)
    lines = []
    questions: list[tuple[str, Callable[[CellSummary], Any], bool]] = [
        ("single-stream throughput", lambda c: c.single_stream_tok_s, True),
        ("peak throughput", lambda c: c.peak_tok_s, True)]
    for what, value, higher in questions:
        w = _winner(ok, value, higher)
        if w:
            lines.append(f"highest {what} (tok/s): {w}")
    common = sorted(set.intersection(*(set(c.throughput_by_level) for c in ok)))
    leaders = [_leader(ok, lv) for lv in common]
    by_level = [[(c.throughput_by_level[lv], c) for c in ok] for lv in common]
    single = next((u for pairs in by_level if (u := _untested(pairs, pairs))), None)
    if common and all(lead is leaders[0] for lead in leaders):
        lines.append(f"{leaders[0].name} has the highest throughput at every level here "
                     f"({', '.join(map(str, common))}{'; ' + single if single else ''})")
    elif common:
        lines.append("highest throughput by level: " + "; ".join(f"{lv}: {lead.name}"
                                                                   for lv, lead in zip(common, leaders))
                     + (f" ({single})" if single else ""))
    if common:
        top = common[-1]
        w = _winner([c for c in ok if top in c.latency_by_level], lambda c: c.latency_by_level.get(top), False)
        if w:
            lines.append(f"lowest mean latency at level {top} (ms): {w}")
    measured = [c for c in ok if c.least_j_per_token]  # "least" needs two cells with energy counters
    w = _winner(measured, lambda c: c.least_j_per_token, False, digits=3) if len(measured) > 1 else None
    if w:
        lines.append(f"least energy per output token, at each cell's most efficient level (J/token): {w}")
    return lines


def _who_wins_by_size(ok: Sequence[CellSummary]) -> list[str]:
    """A prefill grid: who reads the longest prompt fastest (prompt tok/s, client TTFT); a depth grid:
    who decodes fastest at the deepest context. The longest length or depth every cell measured."""
    lines = []
    for what, by, higher, at in (("highest prompt tok/s", lambda c: c.prompt_tok_s_by_length, True, "at {} tokens"),
                                 ("lowest TTFT (ms)", lambda c: c.ttft_by_length, False, "at {} tokens"),
                                 ("highest decode tok/s", lambda c: c.decode_by_depth, True, "at depth {}")):
        common = set.intersection(*(set(by(c)) for c in ok))
        if not common:
            continue
        size = max(common)
        w = _winner(ok, lambda c, by=by, size=size: by(c).get(size), higher)
        if w:
            head, _, unit = what.partition(" (")
            lines.append(f"{head} {at.format(size)}{' (' + unit if unit else ''}: {w}")
    return lines
