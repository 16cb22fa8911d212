"""Sweep configuration: built and validated once at the edge, then read-only.

Errors here are the user's to fix; `ConfigError` (core.errors) carries a one-line message for them.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..analysis.slo import Slo
from ..analysis.trim import Trim
from ..client.backends import ANSWER_APIS, API_NAMES, REASONING_EFFORT_APIS, GenerationParams
from ..core.baseurl import BaseUrl, BaseUrlError, masked
from ..core.errors import ConfigError
from ..core.rundoc import UNBOUNDED_RATE
from .schedule import ARRIVALS

if TYPE_CHECKING:
    from ..core.cache_mode import MultiTurn, SharedPrefix
    from ..core.request_class import RequestClass
    from ..core.workload import DatasetEntry, Workload
    from .prompts import PromptSource
    from .trace_replay import Replay

DEFAULT_PROMPT = "Describe mixture of experts routing in exactly three sentences."


@dataclass(frozen=True, slots=True)
class Target:
    url: str  # base URL, no trailing slash; may carry a path prefix and a query (core.baseurl)
    label: str | None = None  # None: named for the server's model (run.labels)
    # --server-url: the server itself, for /props, /slots, /metrics and /tokenize when `url` is a
    # gateway that does not forward them. None: `url` answers them.
    server_url: str | None = None

    @property
    def hostport(self) -> str:
        parts = urlsplit(self.url)
        return parts.netloc

    @property
    def shown(self) -> str:
        """host:port with the path and query, keys masked: the default label's last resort."""
        return BaseUrl.parse(self.url).text(scheme=False)

    @property
    def display(self) -> str:
        """The base URL for messages and results, keys masked."""
        return BaseUrl.parse(self.url).text()

    @property
    def probe_url(self) -> str:
        """Where the server's own endpoints (/props, /slots, /metrics, /tokenize) are asked."""
        return self.server_url or self.url

    @property
    def secrets(self) -> tuple[str, ...]:
        """Key-like query values of its URLs, never to be written or shown."""
        return tuple(s for u in (self.url, self.server_url) if u for s in BaseUrl.parse(u).secrets())


@dataclass(frozen=True, slots=True)
class MachineOptions:
    """What a run reads of the machine under it (run/machine_sampling.py, docs/environment.md)."""

    sysfs: str = "/sys"  # where sysfs and procfs are mounted (node_exporter's --path.sysfs/--path.procfs)
    procfs: str = "/proc"
    interval_s: float = 1.0  # between environment samples during a level (plus one at its start and end)
    idle_s: float = 2.0  # idle power is measured this long before the first level, when a counter exists
    enabled: bool = True
    telemetry_urls: tuple[str, ...] = ()  # exporters of a remote server's machine, read instead of this one


@dataclass(frozen=True, slots=True)
class SweepConfig:
    targets: tuple[Target, ...]
    concurrency: tuple[int, ...]  # closed-loop levels; ignored when `rates` is given
    generation: GenerationParams
    api: str = "llamacpp"
    model: str | None = None  # OpenAI APIs: None = the first id of the server's /v1/models
    # Open loop: requests/s per level (empty: closed loop), arrival process, gamma shape, cap.
    rates: tuple[float, ...] = ()
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_in_flight: int | None = None
    arrival_seed: int = 0
    # Sent as `Authorization: Bearer ...`; never written anywhere (see to_dict).
    api_key: str | None = field(default=None, repr=False)
    requests_per_level: int | None = None  # None with duration None: max(8, 4*C)
    # Closed loop: spread the workers' first sends over this many seconds (worker i at i*S/C);
    # 0 starts them all at once, as in the field report's script.
    stagger_s: float = 0.0
    duration_s: float | None = None
    # An open-loop level without --requests or --duration: at least this many requests, and this
    # many seconds' worth of the rate if that is more. A sweep's (16, 20 s); capacity's rate search
    # runs longer levels, (40, 30 s), so an overloaded rate's queue shows within the level (docs/capacity.md).
    open_loop_least: tuple[int, float] = (16, 20.0)
    warmup: int = 2
    timeout_s: float = 600.0
    # A response that began and then sends nothing for longer fails `stalled` (core/records.py); None: off.
    stall_s: float | None = None
    wait_ready_s: float = 60.0
    parallel_targets: bool = False
    probe_interval_s: float = 0.25
    knee_gain: float = 0.10
    knee_latency: float = 0.50
    # Only for simulated servers (`loadgen demo`): their durations are divided by this to report
    # the simulated hardware's figures. 1.0 for every real server.
    time_scale: float = 1.0
    # The demo: its simulated servers run on this process's event loop, so loop lag and CPU are
    # theirs too, and are recorded but not taken as a sign that the client is the bottleneck.
    servers_in_process: bool = False
    transport: str = "fast"  # "fast" (client/fast.py) or "aiohttp"; see client/registry.py
    insecure: bool = False  # https without certificate verification
    # --prompt-tokens: every prompt is cut to exactly this many tokens per server, from
    # `prompt_source` (None: synthetic text); `generation`'s prompts are then replaced per target.
    prompt_tokens: int | None = None
    prompt_source: PromptSource | None = None
    # Lengths drawn per request (--prompt-tokens/--n-predict distributions, core/workload.py); None:
    # one shape for every request (prompt_tokens and generation.n_predict). With a workload,
    # prompt_tokens is None and generation.n_predict the largest drawn answer.
    workload: Workload | None = None
    # --n-predict dataset: the sampled --dataset entries with their recorded answers (then
    # prompt_source holds their prompts, in the same order).
    dataset_entries: tuple[DatasetEntry, ...] = ()
    # `loadgen replay`: one open-loop level, each request at its trace time with its trace lengths
    # (run/trace_replay.py); `rates` then holds the trace's mean rate, the level's key.
    replay: Replay | None = None
    # A shared-prefix cache mode (core/cache_mode.py, run/shared_prefix.py); None: salt first, cache off.
    shared_prefix: SharedPrefix | None = None
    # `loadgen chat`'s conversations (run/multiturn.py); None: not a multi-turn run.
    multi_turn: MultiTurn | None = None
    # --workers: processes on this machine that share each level (run/workers/parent.py); 1: this one.
    workers: int = 1
    # --ray: the workers are Ray actors on the cluster at this address ("local": one started for
    # the run, "auto": the running one); None: processes of this machine. workers 0: one per CPU.
    ray_address: str | None = None
    # --slo/--attainment: latency targets each level is judged against (analysis/slo.py); None: none.
    slo: Slo | None = None
    # --percentiles: percentiles of TTFT, latency, TPOT and ITL each level keeps beside the fixed
    # p50/p90/p99/max (analysis/metric_defs.PERCENTILE_METRICS), and the tables show instead; (): none.
    percentiles: tuple[float, ...] = ()
    # --trim: each level's start and end left out of its figures, its records kept (analysis/trim.py).
    trim: Trim | None = None
    machine: MachineOptions = MachineOptions()
    # A run of request classes (core/request_class.py, run/classes.py): each class alone, then all
    # together; they replace the levels (concurrency, rates). Empty: not a run of classes.
    classes: tuple[RequestClass, ...] = ()

    @property
    def open_loop(self) -> bool:
        return bool(self.rates)

    @property
    def connections_per_target(self) -> int:
        """The most connections a target's levels hold open at once, the one place this is computed:
        the top concurrency (closed loop), or the in-flight cap of an open loop (0: no limit); a --rate
        inf level without a cap holds its every request at once."""
        if self.classes:  # all classes at once: their concurrencies side by side; a rate has no bound
            return 0 if any(c.rate is not None for c in self.classes) else sum(c.concurrency for c in self.classes)
        if self.open_loop and not self.max_in_flight and math.inf in self.rates:  # --rate inf: all at once
            return self.requests_per_level or 0
        return (self.max_in_flight or 0) if self.open_loop else max(self.concurrency)

    @property
    def most_in_flight(self) -> int:
        """The most requests one sending process may hold in flight at once, each on a connection of
        its own (0: no bound known): what the open-file check up front counts (cli/sweep.py).
        Closed loop: `connections_per_target`. Open loop: the most requests a level's schedule
        holds (a replay: the trace's), at most the --max-in-flight cap: how many of them stay in
        flight depends on the server's latency, unknowable before the run, so every one may; with
        --workers each process holds its share of them."""
        if self.classes or not self.open_loop or self.ray_address is not None:
            return self.connections_per_target
        if self.replay is not None:
            scheduled = len(self.replay.offsets_ns)
        else:
            scheduled = max(self._scheduled(rate) for rate in self.rates)
        if self.max_in_flight:
            scheduled = min(scheduled, self.max_in_flight)
        return math.ceil(scheduled / max(1, self.workers))

    def _scheduled(self, rate: float) -> int:
        """How many requests a level at `rate` schedules (run/schedule.py's count, from the budget)."""
        requests, duration_s = self.budget(rate)
        if duration_s is None or math.isinf(rate):
            return requests or 0
        in_span = math.ceil(duration_s * rate)
        return in_span if requests is None else min(requests, in_span)

    @property
    def several_processes(self) -> bool:
        """The levels are sent by worker processes or Ray actors, not by this process alone."""
        return self.workers != 1 or self.ray_address is not None

    @property
    def level_count(self) -> int:
        """How many levels a complete sweep runs per target: its levels, or a run of classes' each
        class alone and (two classes or more) each beside the others."""
        if self.classes:
            return len(self.classes) * (2 if len(self.classes) > 1 else 1)
        return len(self.levels)

    @property
    def levels(self) -> tuple[int, ...] | tuple[float, ...]:
        """The level keys, in order: rates (open loop) or concurrencies."""
        return self.rates if self.rates else self.concurrency

    def budget(self, level: int | float) -> tuple[int | None, float | None]:
        """(requests, seconds) for one level: the explicit ones, else max(8, 4×C) requests
        (closed loop) or max(16, 20 s worth) requests (open loop; `open_loop_least`)."""
        if self.duration_s is not None:
            return self.requests_per_level, self.duration_s
        if self.requests_per_level is not None:
            return self.requests_per_level, None
        if self.open_loop and math.isinf(level):  # --rate inf has no "20 s worth" (cli/sweep.py asks --requests)
            raise ConfigError("--rate inf sends a level's requests all at once: give how many with --requests")
        least, seconds = self.open_loop_least
        return (max(least, math.ceil(seconds * level)) if self.open_loop else max(8, 4 * int(level))), None

    @property
    def secrets(self) -> tuple[str, ...]:
        """What no results file may carry: the API key, and the key-like query values of the
        targets' URLs (those of 8 characters or more: a shorter one would mask unrelated text; the
        URLs themselves are written masked whatever the length)."""
        found = [self.api_key] if self.api_key else []
        found += [s for t in self.targets for s in t.secrets if len(s) >= 8 and s not in found]
        return tuple(found)

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def answer_items(self) -> int | None:
        """Texts per request of an API that answers without generating (embeddings, rerank); None otherwise."""
        return self.generation.items if self.api in ANSWER_APIS else None

    def to_dict(self) -> dict:
        g = self.generation
        return {
            "api": self.api,
            "mode": "rate" if self.open_loop else "concurrency",
            "concurrency": list(self.concurrency) if not self.open_loop else None,
            "rates": list(self.rates) if self.open_loop else None,
            "arrival": self.arrival if self.open_loop else None,
            "burstiness": self.burstiness if self.open_loop else None,
            "max_in_flight": self.max_in_flight if self.open_loop else None,
            "arrival_seed": self.arrival_seed if self.open_loop else None,
            "model": self.model,
            "stream": g.stream,
            **({"items": g.items} if self.api in ANSWER_APIS else {}),
            "api_key_set": bool(self.api_key),
            "stagger_s": None if self.open_loop else self.stagger_s,
            "requests_per_level": self.requests_per_level,
            "duration_s": self.duration_s,
            "warmup": self.warmup,
            "timeout_s": self.timeout_s,
            "stall_s": self.stall_s,
            "parallel_targets": self.parallel_targets,
            "probe_interval_s": self.probe_interval_s,
            "knee_gain": self.knee_gain,
            "knee_latency": self.knee_latency,
            "time_scale": self.time_scale,
            "transport": self.transport,
            "insecure": self.insecure,
            "prompt": g.prompt,
            "n_predict": g.n_predict,
            "temperature": g.temperature,
            "ignore_eos": g.ignore_eos,
            "seed": g.seed,
            # A cache mode's bodies are built per target (run/shared_prefix.py): its switch is the mode's.
            "cache_prompt": self.shared_prefix.cache_prompt if self.shared_prefix is not None else g.cache_prompt,
            "prompt_tokens": self.prompt_tokens,
            "prompts": len(g.prompt_list),
            **({"reasoning_effort": g.reasoning_effort} if g.reasoning_effort is not None else {}),
            **_request_features(g),
            "workers": self.workers,
            "ray": self.ray_address,
            # Only when lengths are drawn, so fixed-shape runs keep their shape (and compare as before).
            **({"workload": self.workload.to_dict()} if self.workload is not None else {}),
            **({"workload": {"replay": self.replay.source}} if self.replay is not None else {}),
            **({"cache": self.shared_prefix.to_dict()} if self.shared_prefix is not None else {}),
            **({"cache": self.multi_turn.to_dict()} if self.multi_turn is not None else {}),
            # only when set: a run without targets keeps the shape files had before
            **({"slo": self.slo.to_dict()} if self.slo else {}),
            **({"percentiles": list(self.percentiles)} if self.percentiles else {}),
            **({"trim": self.trim.text} if self.trim is not None else {}),
            **({"classes": [c.to_dict() for c in self.classes]} if self.classes else {}),
            # only when off (--no-environment): `compare` then says why a run has no machine record
            **({"environment": False} if not self.machine.enabled else {}),
        }


def _request_features(g: GenerationParams) -> dict[str, Any]:
    """run.json config's request features (docs/request-features.md) and mixes, only those asked:
    plain runs keep their shape."""
    return {
        **({"json_schema": g.json_schema} if g.json_schema is not None else {}),
        **({"grammar": g.grammar} if g.grammar is not None else {}),
        **({"tools": len(g.tools)} if g.tools else {}),
        **({"tool_choice": g.tool_choice} if g.tool_choice is not None else {}),
        **({"lora_mix": g.lora_mix.spec} if g.lora_mix is not None else {}),
        **({"models": g.model_mix.spec} if g.model_mix is not None else {}),
        **({"images": g.images.to_dict()} if g.images is not None else {}),
    }


def parse_int_list(text: str, what: str, *, minimum: int = 1, maximum: int | None = None) -> tuple[int, ...]:
    """"1,2,4,8" -> (1, 2, 4, 8), rejecting empties, non-integers, out-of-range and duplicates."""
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise ConfigError(f"{what}: expected a comma-separated list like 1,2,4, got {text!r}")
    values = []
    for s in items:
        if not re.fullmatch(r"[+-]?\d+", s):
            raise ConfigError(f"{what}: {s!r} is not an integer")
        v = int(s)
        if v < minimum or (maximum is not None and v > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise ConfigError(f"{what}: {v} is out of range (must be {bound})")
        if v in values:
            raise ConfigError(f"{what}: {v} is listed twice")
        values.append(v)
    return tuple(values)


def normalize_url(url: str, what: str = "--url") -> str:
    """Check a target's base URL (http(s), a host, a numeric port, no credentials; a path prefix and
    a query are kept, see core.baseurl) and return it without a trailing slash."""
    try:
        base = BaseUrl.parse(url)
    except BaseUrlError as exc:
        raise ConfigError(f"{what} {masked(url)!r}: {exc}") from None
    return base.text(masked=False)


def _host_for_url(host: str) -> str:
    """--host as it goes into a URL: IPv6 addresses get brackets; no scheme, path or port allowed."""
    h = host.strip()
    if not h or "/" in h or "://" in h:
        raise ConfigError(f"--host {host!r}: give a host name or address only, e.g. 127.0.0.1")
    try:
        if ipaddress.ip_address(h.strip("[]")).version == 6:
            return f"[{h.strip('[]')}]"
    except ValueError:
        if ":" in h:
            raise ConfigError(f"--host {host!r}: put the port in --ports, not in --host") from None
    return h


def build_targets(host: str, ports: tuple[int, ...] | str | None, urls: tuple[str, ...],
                  labels: tuple[str, ...], server_urls: tuple[str, ...] = ()) -> tuple[Target, ...]:
    found: list[str] = []
    if isinstance(ports, str):
        ports = parse_int_list(ports, "--ports", minimum=1, maximum=65535)
    if ports:
        h = _host_for_url(host)
        found += [normalize_url(f"http://{h}:{p}", "--host/--ports") for p in ports]
    found += [normalize_url(u) for u in urls]
    if not found:
        raise ConfigError("no target: give --ports 8080,8081 or --url http://HOST:PORT")
    if len(set(found)) != len(found):
        raise ConfigError("the same target is listed twice")
    names = given_labels(labels, len(found))
    servers = parse_server_urls(server_urls, len(found))
    return tuple(Target(u, names[i] if names else None, servers[i]) for i, u in enumerate(found))


def given_labels(values: tuple[str, ...], targets: int) -> tuple[str, ...]:
    """--label a,b (or --label a --label b): one distinct, non-empty name per target, or none at all."""
    names = tuple(name.strip() for value in values for name in value.split(","))
    if not names:
        return ()
    if any(not name for name in names):
        raise ConfigError(f"--label {','.join(values)!r}: a label is empty; give one name per target, e.g. a,b")
    if len(names) != targets:
        raise ConfigError(f"{len(names)} label{'s' if len(names) != 1 else ''} for {targets} "
                          f"target{'s' if targets != 1 else ''}: give one --label per target, in order, or none")
    if len(set(names)) != len(names):
        raise ConfigError("--label values must be distinct")
    return names


def parse_server_urls(values: tuple[str, ...], n_targets: int) -> list[str | None]:
    """--server-url, one per target in order (repeated, or a comma list like --ports; an empty item
    leaves that target's own URL): the server behind a gateway, for its /props, /slots, /metrics."""
    items = [item.strip() for v in values for item in v.split(",")]
    if len(items) > n_targets:
        raise ConfigError(f"{len(items)} --server-url values for {n_targets} targets")
    found = [normalize_url(item, "--server-url") if item else None for item in items]
    return found + [None] * (n_targets - len(found))


def check_reasoning_effort(effort: str | None, api: str) -> str | None:
    """--reasoning-effort: only where the API has a field for it."""
    if effort is not None and api not in REASONING_EFFORT_APIS:
        raise ConfigError(f"--reasoning-effort applies to --api {' or '.join(REASONING_EFFORT_APIS)} "
                          f"(the {api} API has no field for it)")
    return effort


def check_api(api: str, model: str | None = None, api_key: str | None = None, *, answers: bool = False) -> str:
    """--api, and the --model and --api-key that go with it; the APIs that answer without generating
    (embeddings, rerank) only where `answers` (a command that sends their --items and reads their figures)."""
    if api not in API_NAMES:
        raise ConfigError(f"--api {api!r}: choose one of {', '.join(API_NAMES)}")
    if api in ANSWER_APIS and not answers:
        raise ConfigError(f"--api {api} runs in `loadgen sweep` (this command measures generation)")
    if model is not None and api == "llamacpp":
        raise ConfigError("--model applies to --api completions, chat, responses or messages (/completion serves the loaded model)")
    if api_key is not None and (not api_key.strip() or any(c in api_key for c in "\r\n")):
        raise ConfigError("the API key is empty or spans lines")
    return api


def check_items(api: str, items: int, *, stream: bool, several_processes: bool, prompt_tokens: bool) -> int:
    """--items, and what the APIs that answer without generating (embeddings, rerank) cannot do:
    stream, cut prompts to an exact length (the salt and item number change it), run in several
    processes (the check's reference answers live in this one, run/answer_check.py)."""
    if items < 1:
        raise ConfigError(f"--items {items}: a request carries at least 1 text")
    if api not in ANSWER_APIS:
        if items != 1:
            raise ConfigError(f"--items applies to --api {' or '.join(ANSWER_APIS)} (the {api} API sends one prompt)")
        return items
    if stream:
        raise ConfigError(f"--api {api} answers whole, it does not stream; drop --stream")
    if several_processes:
        raise ConfigError(f"--api {api} runs in one process (its answers are checked against references kept "
                          "there); drop --workers/--ray")
    if prompt_tokens:
        raise ConfigError(f"--api {api} sends the prompts as given; drop --prompt-tokens/--n-predict distributions")
    return items


def parse_rate_list(text: str, what: str = "--rate") -> tuple[float, ...]:
    """"0.5,1,2" -> (0.5, 1.0, 2.0): positive, finite, distinct requests/s; "inf" (math.inf) sends
    a level's requests all at once (run/schedule.py)."""
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise ConfigError(f"{what}: expected a comma-separated list like 0.5,1,2, got {text!r}")
    values: list[float] = []
    for s in items:
        try:
            v = float(s)
        except ValueError:
            raise ConfigError(f"{what}: {s!r} is not a number") from None
        if v == math.inf and s.lower() == UNBOUNDED_RATE:  # --rate inf: the level's requests all at once
            if v in values:
                raise ConfigError(f"{what}: {s} is listed twice")
            values.append(v)
            continue
        if not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{what}: {s} is not a positive rate in requests/s")
        if v > 100_000:
            raise ConfigError(f"{what}: {s} requests/s is beyond what one client process can send")
        if v in values:
            raise ConfigError(f"{what}: {s} is listed twice")
        values.append(v)
    return tuple(values)


def check_arrival(arrival: str, burstiness: float) -> str:
    if arrival not in ARRIVALS:
        raise ConfigError(f"--arrival {arrival!r}: choose one of {', '.join(ARRIVALS)}")
    if not math.isfinite(burstiness) or burstiness <= 0:
        raise ConfigError(f"--burstiness {burstiness}: must be a positive gamma shape (1 = Poisson)")
    if burstiness != 1.0 and arrival != "gamma":
        raise ConfigError("--burstiness only applies to --arrival gamma")
    return arrival


@dataclass(frozen=True, slots=True)
class SoakSettings:
    """A soak's own settings beside its `SweepConfig` (one level at `concurrency`): how long, how
    often run.json is rewritten, the exact prompt length (None: as the prompt source gives it), how
    often the server is scraped, and the prompt source's description. `to_dict` is their part of
    run.json's `config`, in this order."""

    concurrency: int
    duration_s: float
    checkpoint_interval_s: float
    prompt_tokens: int | None
    probe_interval_s: float
    prompt_source: str  # what cli/shared.py's `describe` says of it

    def to_dict(self) -> dict:
        return {"concurrency": [self.concurrency], "duration_s": self.duration_s,
                "checkpoint_interval_s": self.checkpoint_interval_s, "prompt_tokens": self.prompt_tokens,
                "probe_interval_s": self.probe_interval_s, "prompt_source": self.prompt_source}
