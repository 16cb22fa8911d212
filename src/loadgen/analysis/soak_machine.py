"""A soak's machine, window by window: its environment samples folded as each window closes, so a
day-long soak keeps a bounded number of them (pure: samples in, figures out; docs/environment.md).

A window's machine spans from the last sample before it (its opening; the soak's first sample for
the first window) to its last sample, so the windows' spans tile the soak and their energies add up
to the soak's. As a sample arrives in a later window the open one closes into a `WindowMachine`:
- changes = analysis/env_drift.level_changes over the window's kept samples (the rules of a level:
  link downshift, throttle reasons appearing, a power limit changed, steal above its limit), so a
  window is flagged for what changed under it, not for a state an earlier window changed into
- energy  = analysis/energy.energy_between its opening and its last sample, joules per source
A window keeps in memory its opening, its last sample and at most WINDOW_MARKS samples in which a
change first showed (a sample that adds no change line is dropped). The soak's level keeps at most
STORED_SAMPLES (core/environment.py) of the samples: every window's marks and last, thinned evenly
when there are more, always the first and the last; its level-wide changes and energy are judged
over those. Samples taken before the soak's clock started count in its first window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..core.environment import STORED_SAMPLES, EnvSample, thinned
from .energy import energy_between
from .env_drift import STEAL_CHANGE, level_changes

WINDOW_MARKS = 8  # the most samples a window keeps in which a change first showed


@dataclass(frozen=True, slots=True)
class WindowMachine:
    """The machine under one soak window: what changed during it and the joules per source it used."""

    index: int
    seconds: float  # from its opening sample to its last
    energy_j: dict[str, float]
    changes: list[str]


def _keys(changes: list[str]) -> set[str]:
    """A change's identity without when it showed; steal (first to last share) marks no sample."""
    return {c.split(" at ")[0] for c in changes if not c.startswith(STEAL_CHANGE)}


@dataclass(slots=True)
class _OpenWindow:
    index: int
    kept: list[EnvSample]  # its opening, then the samples where a change first showed
    last: EnvSample

    def add(self, sample: EnvSample) -> bool:
        """Take `sample` as the window's last; keep it as a mark too when a change first shows in it."""
        self.last = sample
        if len(self.kept) > WINDOW_MARKS or not _keys(level_changes([*self.kept, sample])) - _keys(level_changes(self.kept)):
            return False
        self.kept.append(sample)
        return True

    def folded(self) -> WindowMachine:
        samples = [*self.kept, self.last] if self.last is not self.kept[-1] else self.kept
        return WindowMachine(self.index, self.last.at_s - self.kept[0].at_s,
                             energy_between(self.kept[0], self.last), level_changes(samples))


@dataclass
class SoakMachine:
    """A soak level's `environment`: samples `append`ed as run/machine_sampling.py reads them, folded
    per window of `window_s` from the soak's start (`start_s()`: seconds since the run's start on the
    samples' clock, None before the soak's clock starts). Iterating gives the stored samples."""

    window_s: float
    start_s: Callable[[], float | None]
    closed: list[WindowMachine] = field(default_factory=list)
    stored: list[EnvSample] = field(default_factory=list)
    open: _OpenWindow | None = None

    def _index(self, sample: EnvSample) -> int:
        start = self.start_s()
        return 0 if start is None else max(0, int((sample.at_s - start) // self.window_s))

    def append(self, sample: EnvSample) -> None:
        index = self._index(sample)
        if self.open is None:
            self.open = _OpenWindow(index, [sample], sample)
            self._store(sample)
        elif index > self.open.index:
            self.closed.append(self.open.folded())
            opening = self.open.last
            if not self.stored or self.stored[-1] is not opening:
                self._store(opening)
            self.open = _OpenWindow(index, [opening], opening)
            self._window_sample(sample)
        else:
            self._window_sample(sample)

    def _window_sample(self, sample: EnvSample) -> None:
        assert self.open is not None
        if self.open.add(sample):
            self._store(sample)

    def _store(self, sample: EnvSample) -> None:
        self.stored.append(sample)
        if len(self.stored) > STORED_SAMPLES:
            self.stored = thinned(self.stored, STORED_SAMPLES // 2 + 1)

    def windows(self) -> list[WindowMachine]:
        """The closed windows and the open one as it stands (a checkpoint reads it mid-window)."""
        return self.closed + ([self.open.folded()] if self.open is not None else [])

    def in_memory(self) -> int:
        """Samples held: the stored ones and the open window's (closed windows hold none)."""
        held = {id(s) for s in self.stored}
        if self.open is not None:
            held |= {id(s) for s in (*self.open.kept, self.open.last)}
        return len(held)

    def samples(self) -> list[EnvSample]:
        """The stored samples with the latest one last (the level's ends: its energy and its changes)."""
        last = self.open.last if self.open is not None else None
        return self.stored + ([last] if last is not None and (not self.stored or self.stored[-1] is not last) else [])

    def __iter__(self) -> Iterator[EnvSample]:
        return iter(self.samples())

    def __len__(self) -> int:
        return len(self.samples())


def per_window(machine: list[WindowMachine], count: int) -> list[WindowMachine | None]:
    """The machine of each of a soak's `count` windows (None: no sample fell in it); windows past the
    last folded into it, as analysis/soak.py folds their requests."""
    out: list[WindowMachine | None] = [None] * count
    for w in machine:
        i = min(w.index, count - 1)
        seen = out[i]
        if seen is None:
            out[i] = WindowMachine(i, w.seconds, dict(w.energy_j), list(w.changes))
        else:
            energy = {k: seen.energy_j.get(k, 0.0) + w.energy_j.get(k, 0.0) for k in seen.energy_j.keys() | w.energy_j.keys()}
            out[i] = WindowMachine(i, seen.seconds + w.seconds, energy, seen.changes + w.changes)
    return out
