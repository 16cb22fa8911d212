"""Energy per token, from the energy counters of a level's environment samples (pure; docs/metrics.md).

Counters: RAPL's `energy_uj` of the top-level package zones (`package-N`; `psys` and sub-zones overlap
them and are left out) and each GPU's NVML total energy (`energy_mj`); on Apple Silicon, `powermetrics`'
CPU, GPU and ANE power integrated over time (a sample's `mac_energy`, client/mac_power.py: "cpu", "gpu",
"ane"). A counter's energy over an
interval is last − first, plus its `max_energy_range_uj` when it wrapped (RAPL wraps; NVML's does not
within a run). Per source ("cpu": RAPL, "gpu": NVML), over a level from its first to its last sample:

    energy_j         = Σ counters' (last − first)
    mean_w           = energy_j / (t_last − t_first)
    net_energy_j     = energy_j − idle_w × (t_last − t_first)   (idle_w: measured before the first level)
    j_per_token      = energy_j / output_tokens                  (gross)
    net_j_per_token  = net_energy_j / output_tokens
    tokens_per_j     = output_tokens / energy_j

and the same over all sources together ("total"). A net figure at or below zero
(`within_idle_noise`: the idle power read a little above the level's) is kept as computed in run.json,
but shown as "≤0 (within idle noise)", never as a figure. The level's span is its samples' (start and end
of the level, read right before and after it), not the request clock: the counters are read then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..core.environment import EnvSample


@dataclass(frozen=True, slots=True)
class Energy:
    """One source's energy over a level; the per-token figures are None without output tokens."""

    source: str  # "cpu" (RAPL packages), "gpu" (NVML), "total"
    seconds: float
    energy_j: float
    mean_w: float
    idle_w: float | None
    net_energy_j: float | None
    j_per_token: float | None
    net_j_per_token: float | None
    tokens_per_j: float | None

    def to_dict(self) -> dict[str, float | str | None]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def within_idle_noise(net: float | None) -> bool:
    """Whether a net figure (`net_energy_j`, `net_j_per_token`) is at or below zero: the load added no
    more than the spread of the idle reading it subtracts (a level at the idle power, with the idle
    measured slightly higher), so there is no energy above idle to show."""
    return net is not None and net <= 0


def counters_j(sample: EnvSample) -> dict[str, dict[str, tuple[float, float | None]]]:
    """source -> {counter: (joules, wrap range in joules or None)} in one sample."""
    cpu: dict[str, tuple[float, float | None]] = {z.zone: (z.energy_uj / 1e6, z.max_energy_range_uj / 1e6 if z.max_energy_range_uj else None)
           for z in sample.rapl if z.energy_uj is not None and z.name.startswith("package")}
    gpu: dict[str, tuple[float, float | None]] = {f"gpu{g.index}": (g.energy_mj / 1e3, None) for g in sample.gpus if g.energy_mj is not None}
    ane: dict[str, tuple[float, float | None]] = {}
    if (mac := sample.mac_energy) is not None:  # Apple Silicon's powermetrics, integrated (client/mac_power.py)
        for joules, into in ((mac.cpu_j, cpu), (mac.gpu_j, gpu), (mac.ane_j, ane)):
            if joules is not None:
                into.update(powermetrics=(joules, None))
    return {k: v for k, v in (("cpu", cpu), ("gpu", gpu), ("ane", ane)) if v}


def energy_between(first: EnvSample, last: EnvSample) -> dict[str, float]:
    """source -> joules between two samples, over the counters both hold (a wrap adds its range)."""
    a, b = counters_j(first), counters_j(last)
    out = {}
    for source in a.keys() & b.keys():
        total = 0.0
        for name in a[source].keys() & b[source].keys():
            (start, wrap), (end, _) = a[source][name], b[source][name]
            delta = end - start
            if delta < 0 and wrap:
                delta += wrap
            total += max(0.0, delta)
        out[source] = total
    return out


def idle_power(samples: Sequence[EnvSample]) -> dict[str, float]:
    """source -> mean watts between the first and last of samples taken while idle (before the
    first level); {} when there are fewer than two samples or no time passed."""
    if len(samples) < 2 or samples[-1].at_s <= samples[0].at_s:
        return {}
    seconds = samples[-1].at_s - samples[0].at_s
    return {s: j / seconds for s, j in energy_between(samples[0], samples[-1]).items()}


def level_energy(samples: Sequence[EnvSample], output_tokens: int,
                 idle_w: dict[str, float] | None = None) -> list[Energy]:
    """Each source's energy over a level (its samples in time order), then "total" when there are
    several; [] without two samples or without counters."""
    if len(samples) < 2 or samples[-1].at_s <= samples[0].at_s:
        return []
    return energy_of(energy_between(samples[0], samples[-1]), samples[-1].at_s - samples[0].at_s, output_tokens, idle_w)


def energy_of(per: dict[str, float], seconds: float, output_tokens: int,
              idle_w: dict[str, float] | None = None) -> list[Energy]:
    """`level_energy`'s figures from joules per source over `seconds` (a soak window's, folded as it
    closed: analysis/soak_machine.py); [] without joules or without time."""
    if not per or seconds <= 0:
        return []
    idle_w = idle_w or {}
    rows = [(source, joules, idle_w.get(source)) for source, joules in sorted(per.items())]
    if len(rows) > 1:
        idle_total = sum(idle_w[s] for s in per) if all(s in idle_w for s in per) else None
        rows.append(("total", sum(per.values()), idle_total))
    return [_energy(source, joules, seconds, idle, output_tokens) for source, joules, idle in rows]


def _energy(source: str, joules: float, seconds: float, idle_w: float | None, tokens: int) -> Energy:
    net = joules - idle_w * seconds if idle_w is not None else None
    per_token = tokens > 0
    return Energy(source=source, seconds=seconds, energy_j=joules, mean_w=joules / seconds, idle_w=idle_w,
                  net_energy_j=net, j_per_token=joules / tokens if per_token else None,
                  net_j_per_token=net / tokens if per_token and net is not None else None,
                  tokens_per_j=tokens / joules if per_token and joules > 0 else None)
