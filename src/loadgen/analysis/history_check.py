"""Which earlier runs the newest run is judged against (`loadgen history check`): the same identity, or a refusal.

A run's identity per target is what must not change for two runs to answer the same question: the
run's kind, the target's label, the model file (name, size and, where loadgen can read the file,
a fingerprint of its content), the workload (the config's prompt,
lengths, API and streaming, hashed), the machine (its fingerprint's key facts, hashed) and, for a
server loadgen started (a grid's cell, tune, bisect), its flags: a grid's cells share the label
`server`, and a cell of `--parallel 8` is another question than one of `--parallel 1`. The
llama.cpp build is not part of it: a different build is what a check looks for.

The rule (`baseline_runs`), for the newest run's target:
- the earlier runs are those of the same label, newest first (the newest run itself excluded);
- one is like for like when every identity field equals the newest's, a field unknown on either
  side (None: a server without /props, a run without the machine) counting as equal: a missing fact
  is not a changed fact;
- the baseline is the `lookback` newest like-for-like runs;
- no earlier run of that label at all: nothing to judge against (NO_HISTORY);
- earlier runs, none like for like: REFUSED, naming the fields in which the newest differs from the
  most recent earlier run (vLLM's dashboard once called a "massive regression" what was two kinds of
  run mixed by a missing identity field);
- fewer than MIN_BASELINE like-for-like runs: TOO_FEW (Conbench gives no verdict without two earlier
  runs of the same case on the same machine): the gate cannot tell noise from a change with one.
Pure: the store (results/history.py) hands the rows in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

IDENTITY_FIELDS = ("kind", "model", "model_size", "model_fingerprint", "workload_hash", "machine_hash", "server_flags")
MIN_BASELINE = 2
DEFAULT_LOOKBACK = 10
OK, NO_HISTORY, REFUSED, TOO_FEW = "ok", "no history", "refused", "too few"


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """One run's target as the store keeps it: when, where its folder is, and its identity fields."""

    run_id: int
    started_utc: str
    folder: str
    label: str | None
    kind: str | None = None
    model: str | None = None
    model_size: int | None = None
    workload_hash: str | None = None
    machine_hash: str | None = None
    server_flags: str | None = None  # a server loadgen started (grid, tune, bisect): its flags but --port/--host
    model_fingerprint: str | None = None  # the model file's content (results/model_fingerprint.py), where readable

    def differs(self, other: RunIdentity) -> tuple[str, ...]:
        """The identity fields known on both sides whose values differ."""
        return tuple(f for f in IDENTITY_FIELDS if (a := getattr(self, f)) is not None
                     and (b := getattr(other, f)) is not None and a != b)


@dataclass(frozen=True, slots=True)
class Baseline:
    status: str  # OK, NO_HISTORY, REFUSED or TOO_FEW
    runs: tuple[RunIdentity, ...] = ()  # the like-for-like earlier runs, newest first (at most lookback)
    differs: tuple[str, ...] = ()  # REFUSED: the fields that differ from the most recent earlier run
    against: RunIdentity | None = None  # REFUSED: that run

    def reason(self, newest: RunIdentity) -> str:
        """The one line that says why there is no verdict (empty when OK)."""
        who = f"target {newest.label}" if newest.label else "the target"
        if self.status == NO_HISTORY:
            return f"the history holds no earlier run of {who}: nothing to judge the newest run against"
        if self.status == REFUSED and self.against is not None:
            fields = ", ".join(f"{f} {getattr(newest, f)!r} (earlier {getattr(self.against, f)!r})" for f in self.differs)
            return (f"no earlier run of {who} is like for like: the newest run's {fields}; a different "
                    f"{'/'.join(self.differs)} is another question, not a regression")
        if self.status == TOO_FEW:
            return (f"{len(self.runs)} earlier run(s) of {who} are like for like; a verdict needs at least "
                    f"{MIN_BASELINE} (one cannot tell the machine's noise from a change)")
        return ""


def baseline_runs(newest: RunIdentity, earlier: Sequence[RunIdentity], lookback: int = DEFAULT_LOOKBACK) -> Baseline:
    """The earlier runs to judge `newest` against (module docstring)."""
    same_label = sorted((r for r in earlier if r.label == newest.label and r.run_id != newest.run_id),
                        key=lambda r: (r.started_utc, r.run_id), reverse=True)
    if not same_label:
        return Baseline(NO_HISTORY)
    alike = tuple(r for r in same_label if not newest.differs(r))[:lookback]
    if not alike:
        return Baseline(REFUSED, differs=newest.differs(same_label[0]), against=same_label[0])
    if len(alike) < MIN_BASELINE:
        return Baseline(TOO_FEW, alike)
    return Baseline(OK, alike)
