"""The report's view model: every target of every run as one `TargetSeries`, what the HTML page,
its Markdown twin (`html.py`) and the charts (`charts.py`) draw from. Plain data; no drawing here.

With several runs a series is labelled `<dir name>: <target>`, and a run not marked complete says so
in every label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.records import ProbeSample, RequestRecord
from ..core.rundoc import Level, RunDocument, Target, Verdict

INCOMPLETE = "incomplete"


@dataclass
class TargetSeries:
    """One target of one run, as drawn and tabulated."""

    label: str
    run_name: str
    target: Target
    records: list[RequestRecord] = field(default_factory=list)
    probe: list[ProbeSample] = field(default_factory=list)
    complete: bool = True
    open_loop: bool = False  # its run's levels are request rates (core.rundoc.is_open_loop)

    @property
    def levels(self) -> list[Level]:
        return list(self.target.levels)

    @property
    def total_slots(self) -> int | None:
        return None if self.target.server is None else self.target.server.total_slots

    @property
    def verdict(self) -> Verdict:
        return self.target.verdict or Verdict()


def build_series(sources: Sequence[dict[str, Any]]) -> list[TargetSeries]:
    """sources: {"name", "run", "records", "probe"} per results directory, in the order given."""
    several = len(sources) > 1
    series = []
    for source in sources:
        run = RunDocument.of(source["run"])
        complete = run.complete
        for target in run.targets:
            name = target.label
            label = f"{source['name']}: {name}" if several else name
            if not complete:
                label += f" ({INCOMPLETE})"
            series.append(TargetSeries(
                label=label, run_name=source["name"], target=target, complete=complete, open_loop=run.open_loop,
                records=[r for r in source["records"] if r.target == name],
                probe=[s for s in source["probe"] if s.target == name]))
    return series
