"""noise.json: a machine's measured run-to-run noise (an A/A calibration), kept beside a baseline.

`loadgen calibrate RUNS` writes it from several runs of one unchanged configuration; `compare`
and `gate` read it from the baseline's folder (or `--noise FILE`) to judge a difference between
runs against it. Written atomically; a damaged file is refused in one line.

Format (version 1): {"loadgen_noise": 1, "created_utc", "runs", "method", "floors": [{"metric",
"target", "level", "sigma", "df"}], "by_metric": {metric: {"sigma", "df"}}}. `sigma` is the
standard deviation of log(value) between neighbouring runs (0.05 is about 5%), `df` its degrees
of freedom.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import msgspec

from ..analysis.between_runs import Floor
from ..analysis.compare import NoiseFloors
from ..core.errors import ResultsError
from .atomic import write_json

NOISE_FILE = "noise.json"
NOISE_VERSION = 1
METHOD = "successive differences of log values between runs of one configuration"


class _Floor(msgspec.Struct):
    sigma: float
    df: int


class _LevelFloor(msgspec.Struct):
    metric: str
    target: str
    level: int | float
    sigma: float
    df: int


class _NoiseFile(msgspec.Struct):
    loadgen_noise: int
    floors: list[_LevelFloor]
    by_metric: dict[str, _Floor]
    runs: int = 0
    created_utc: str = ""
    method: str = METHOD


def noise_document(floors: NoiseFloors, runs: int) -> dict:
    return {
        "loadgen_noise": NOISE_VERSION, "created_utc": _dt.datetime.now(_dt.UTC).isoformat(),
        "runs": runs, "method": METHOD,
        "floors": [{"metric": m, "target": t, "level": lv, "sigma": f.sigma, "df": f.df}
                   for (m, t, lv), f in sorted(floors.exact.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))],
        "by_metric": {m: {"sigma": f.sigma, "df": f.df} for m, f in floors.by_metric.items()},
    }


def write_noise(path: Path, floors: NoiseFloors, runs: int) -> dict:
    """Write noise.json atomically at `path` (a file, or a folder to hold NOISE_FILE)."""
    target = path / NOISE_FILE if path.is_dir() else path
    doc = noise_document(floors, runs)
    write_json(target, doc)
    return doc


def load_noise(path: Path) -> NoiseFloors:
    """Read a noise.json (a file, or a folder holding one). ResultsError in one line when it is
    missing or damaged."""
    target = path / NOISE_FILE if path.is_dir() else path
    try:
        raw = target.read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{target}: no noise file (make one with `loadgen calibrate RUNS`)") from None
    except OSError as exc:
        raise ResultsError(f"{target}: cannot read ({exc.strerror})") from None
    try:
        doc = msgspec.json.decode(raw, type=_NoiseFile)
    except msgspec.DecodeError as exc:
        raise ResultsError(f"{target}: not a loadgen noise file ({str(exc).splitlines()[0]})") from None
    if doc.loadgen_noise != NOISE_VERSION:
        raise ResultsError(f"{target}: noise file version {doc.loadgen_noise}; this loadgen reads {NOISE_VERSION}")
    every: list[_Floor | _LevelFloor] = [*doc.floors, *doc.by_metric.values()]
    bad = [f for f in every if not (f.sigma >= 0 and f.df >= 1)]
    if bad:
        raise ResultsError(f"{target}: a floor with sigma < 0 or df < 1")
    return NoiseFloors({(f.metric, f.target, f.level): Floor(f.sigma, f.df) for f in doc.floors},
                       {m: Floor(f.sigma, f.df) for m, f in doc.by_metric.items()}, str(target))
