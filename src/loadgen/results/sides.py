"""A side of a comparison on disk: one results directory, or a folder of them (several runs of one
configuration, e.g. what `loadgen ab` writes, or runs saved by hand), plus its noise floor."""

from __future__ import annotations

from pathlib import Path

from ..analysis.compare import NoiseFloors, RunData
from ..core.errors import ResultsError
from .grid_file import runs_in_grid
from .noise import NOISE_FILE, load_noise
from .reader import load_records, load_run_dict
from .schema import RUN_FILE


def run_dirs(path: Path) -> list[Path]:
    """The results directories of a side: `path` itself when it holds a run.json, else its
    subfolders that do (sorted by name); inside a grid, the runs of the cell it names (`runs_in_grid`)."""
    if (path / RUN_FILE).is_file():
        return [path]
    in_grid = runs_in_grid(path)
    if in_grid is not None:
        return in_grid
    if not path.is_dir():
        raise ResultsError(f"{path}: no such results directory")
    found = sorted(p for p in path.iterdir() if p.is_dir() and (p / RUN_FILE).is_file())
    if not found:
        raise ResultsError(f"{path}: no {RUN_FILE} in it or in its subfolders; is it a results directory?")
    return found


def load_side(path: Path) -> list[RunData]:
    return [RunData(load_run_dict(p), load_records(p)) for p in run_dirs(path)]


def calibration_runs(path: Path) -> list[tuple[str, RunData]]:
    """The runs of a folder to calibrate, each named by its place in it ("03", "baseline/01"): a
    results directory's subfolders, or an `ab` folder's baseline/NN and candidate/NN."""
    if (path / "baseline").is_dir():
        folders = [*run_dirs(path / "baseline"), *run_dirs(path / "candidate")]
    else:
        folders = run_dirs(path)
    return [(p.relative_to(path).as_posix() if p.is_relative_to(path) and p != path else p.parent.name
             if p.name == "run" else p.name, RunData(load_run_dict(p), load_records(p))) for p in folders]


def side_noise(path: Path, explicit: Path | None = None) -> NoiseFloors | None:
    """The noise floor to judge against: `explicit` (--noise), else a noise.json in the side's folder."""
    if explicit is not None:
        return load_noise(explicit)
    if (path / NOISE_FILE).is_file():
        return load_noise(path / NOISE_FILE)
    return None


def without_levels(run: RunData, left_out: set[tuple[str, int | float]]) -> RunData:
    """The run less its levels `left_out` ((target, level)) and their records. The dict is run.json's
    own (`RunData.doc`: `compare` reads every config key of it), the typed document has the same
    targets and levels, in order."""
    doc = {**run.doc, "targets": [{**stored, "levels": [kept for kept, lv in zip(stored.get("levels") or [], t.levels, strict=True)
                                                        if (t.label, lv.level) not in left_out]}
                                  for stored, t in zip(run.doc["targets"], run.typed.targets, strict=True)]}
    return RunData(doc, [r for r in run.records if (r.target, r.level) not in left_out])
