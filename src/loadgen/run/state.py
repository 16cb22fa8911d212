"""One run model for every kind of run: a `Run` of `TargetRun`s, each a list of levels.

A sweep's target has one `LevelRun` per concurrency or rate; a prefill or depth target one `Step`
per prompt length or depth (each with its level, or why it was skipped); a soak target one long
level. The `Run` is owned by the caller, so whatever happens (Ctrl-C, a dead server) every record
gathered so far can still be written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..client.probe import ServerInfo
from ..core.clock import now_ns
from ..core.records import LevelRun
from ..core.recordsink import RecordSink
from ..core.rundoc import RunKind
from .config import SoakSettings, SweepConfig, Target
from .engine import Observer
from .labels import LabelSource, target_labels


@dataclass(slots=True)
class Step:
    size: int  # prompt tokens asked for: the prefill length, or the depth
    level: LevelRun | None = None  # None: skipped
    note: str | None = None  # how the prompt was built when it is not exactly `size` tokens
    skipped: str | None = None  # why no request was sent


@dataclass(slots=True)
class TargetRun:
    target: Target
    label: str
    info: ServerInfo | None = None
    levels: list[LevelRun] = field(default_factory=list)
    error: str | None = None  # why this target stopped early, for the user
    model: str | None = None  # the model name sent (OpenAI APIs)
    read_clock: str | None = None  # what its reads' times are: "kernel" or "loop" (see client.transport)
    steps: list[Step] = field(default_factory=list)  # prefill and depth only
    # --n-predict dataset: (entries, of them skipped as longer than this target's per-slot context);
    # None: not a dataset-answers run (run/dataset_answers.py).
    dataset_fit: tuple[int, int] | None = None
    # Prompt lengths loadgen had to change on this target (a replayed trace's prompts too short to
    # hold the salt, floored): (requests changed, of requests, the floor in tokens); None: none changed.
    lengths_floored: tuple[int, int, int] | None = None
    # `loadgen slots`: each cycle's figures (analysis/slots.py `CycleFigures`), in the order run.
    slot_cycles: list[Any] = field(default_factory=list)
    # `loadgen wake`: each cycle's figures (core/rundoc.py `WakeCycle`), in the order run.
    wake_cycles: list[Any] = field(default_factory=list)
    # --models against a router (run/router.py): each model's status changes as /models was polled
    # through the levels (core/model_mix.py `ModelEvent`), and the router's --models-max (/props `max_instances`).
    model_events: list[Any] = field(default_factory=list)
    models_max: int | None = None
    # --images: what the images cost this target, measured before the first level (run/images.py); None: no images.
    images: dict[str, Any] | None = None


@dataclass(slots=True)
class Run:
    config: SweepConfig  # targets, API, generation settings, timeouts; a sweep's levels
    kind: RunKind = RunKind.SWEEP  # the command that runs it (run.json's "kind")
    # A soak's own settings, typed; prefill's and depth's, a dict: each their part of run.json's config.
    settings: SoakSettings | dict[str, Any] = field(default_factory=dict)
    targets: list[TargetRun] = field(default_factory=list)
    interrupted: bool = False
    start_ns: int = field(default_factory=now_ns)
    end_ns: int | None = None
    # Where the levels' records stream (the session's results writer opens it, run/session.py); None: each level keeps a list.
    sink: RecordSink | None = None
    # Where the probe's samples stream as they are scraped (probe.jsonl; `RecordSink.write_samples`);
    # None: they are written with run.json (a run driven from Python).
    probe_sink: RecordSink | None = None
    # The session's checkpoint (run/session.py): run.json rewritten soon, off the event loop; set
    # while a session runs. Called once the targets' facts are known, before the first level.
    checkpoint: Callable[[], None] | None = None
    # The machine's fingerprint read before the first level (`core.environment.Fingerprint`), with
    # its idle power; None when the run does not read the machine (run/machine_sampling.py).
    environment: Any = None

    @property
    def complete(self) -> bool:
        """Nothing was stopped or failed; a sweep also ran every level of its config on every target
        (a prefill or depth run may skip a step that does not fit)."""
        return not self.interrupted and all(t.error is None for t in self.targets) and all(
            (not self.kind.has_levels or len(t.levels) == self.config.level_count)
            and all(lv.finished and lv.stopped_reason is None for lv in t.levels)
            for t in self.targets)


    def settings_dict(self) -> dict[str, Any]:
        """The kind's own settings as run.json's `config` carries them, after the SweepConfig's."""
        return self.settings.to_dict() if isinstance(self.settings, SoakSettings) else dict(self.settings)


class RunObserver(Observer, Protocol):
    def message(self, text: str) -> None: ...

    def level_done(self, run: Run, target: TargetRun, level: LevelRun) -> None: ...


class StepObserver(RunObserver, Protocol):
    def step_started(self, target: TargetRun, step: Step) -> None: ...

    def step_done(self, run: Run, target: TargetRun, step: Step) -> None: ...


def resolve_labels(targets: list[TargetRun]) -> None:
    """Each target's label (run.labels): the user's, else its model's short name, told apart by port."""
    sources = [LabelSource(url=t.target.url, given=t.target.label, model=server_model_name(t.info), address=t.target.shown)
               for t in targets]
    for t, label in zip(targets, target_labels(sources)):
        t.label = label


def server_model_name(info: ServerInfo | None) -> str | None:
    """What the server calls its model: /props model_alias (its path when started without --alias),
    else model_path, else the first /v1/models id."""
    props = (info.props if info else None) or {}
    for name in (props.get("model_alias"), props.get("model_path"), *(info.models[:1] if info else [])):
        if isinstance(name, str) and name.strip():
            return name
    return None


def maybe_router(info: ServerInfo | None) -> bool:
    """Whether the server may be llama-server's router (run/router.py asks its /props role): it answered
    /props without `total_slots`, which a server of one model always gives."""
    props = info.props if info else None
    return props is not None and not isinstance(props.get("total_slots"), int)


def slot_context(t: TargetRun) -> int | None:
    """The server's per-slot context (/props default_generation_settings.n_ctx), or None if unknown."""
    props = t.info.props if t.info else None
    n_ctx = props.get("n_ctx") if props else None
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None
