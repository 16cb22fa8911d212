"""The Grafana dashboard `loadgen observe` writes: the servers' `/metrics` and loadgen's live
metrics on one time axis, every target side by side.

The panels are plain data (`PANELS`: title, description, queries), so the panel list in
docs/observe.md and the tests read the same definitions the dashboard is built from. The JSON is built with Grafana's
own types (`grafana-foundation-sdk`, a dependency of loadgen), which fill in the
dashboard model's defaults (schemaVersion, gridPos layout, field config).

Every server query uses a series llama-server emits today (see the shared llama-server notes:
no `kv_cache_*`), and every rate is a `rate()` of a `_total` counter: the `*_tokens_seconds`
gauges are averages since the previous scrape, which every scraper resets for the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UserError

DATASOURCE_VARIABLE = "datasource"
RATE = "$__rate_interval"  # Grafana's rate window: at least four scrape intervals
DASHBOARD_UID = "loadgen-live"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    source: str = "server"  # "server": llama-server's /metrics; "loadgen": loadgen's live metrics
    width: int = 12


def _quantiles(metric: str, what: str, quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)) -> tuple[Query, ...]:
    return tuple(Query(f"histogram_quantile({q:g}, sum by (target, le) (rate({metric}_bucket[{RATE}])))",
                       f"{{{{target}}}} {what} p{q * 100:g}") for q in quantiles)


SERVER_PANELS = (
    Panel("Requests processing vs deferred",
          "llama-server's requests_processing (busy slots now) and requests_deferred (tasks waiting for a "
          "free slot). A deferred count above 0 means the server is over-subscribed: requests queue.",
          (Query("llamacpp:requests_processing", "{{alias}} processing"),
           Query("llamacpp:requests_deferred", "{{alias}} deferred"))),
    Panel("Generated tokens/s",
          "rate() of llamacpp:tokens_predicted_total: total decode throughput. The server adds a "
          "request's tokens when it finishes, so short windows show steps.",
          (Query(f"rate(llamacpp:tokens_predicted_total[{RATE}])", "{{alias}}"),), unit="none"),
    Panel("Prompt tokens/s",
          "rate() of llamacpp:prompt_tokens_total: prompt tokens processed per second (prefill).",
          (Query(f"rate(llamacpp:prompt_tokens_total[{RATE}])", "{{alias}}"),), unit="none"),
    Panel("Seconds per token",
          "From the counter pairs: rate(tokens_predicted_seconds_total) / rate(tokens_predicted_total) is the "
          "time per generated token of one sequence; the prompt pair gives the time per prompt token.",
          (Query(f"rate(llamacpp:tokens_predicted_seconds_total[{RATE}]) / "
                 f"rate(llamacpp:tokens_predicted_total[{RATE}])", "{{alias}} generation"),
           Query(f"rate(llamacpp:prompt_seconds_total[{RATE}]) / rate(llamacpp:prompt_tokens_total[{RATE}])",
                 "{{alias}} prompt")), unit="s"),
    Panel("Batching: busy slots per decode",
          "llamacpp:n_busy_slots_per_decode: the average number of slots each llama_decode() call served "
          "since the server started (a cumulative average: it moves slowly on a long-running server).",
          (Query("llamacpp:n_busy_slots_per_decode", "{{alias}}"),)),
    Panel("Decode calls/s",
          "rate() of llamacpp:n_decode_total: llama_decode() calls per second. Tokens/s divided by this "
          "is the batch size.",
          (Query(f"rate(llamacpp:n_decode_total[{RATE}])", "{{alias}}"),), unit="none"),
)

LOADGEN_PANELS = (
    Panel("Throughput per target (loadgen)",
          "rate() of loadgen_output_tokens_total: generated tokens/s of the requests loadgen completed, "
          "counted as the server reported them.",
          (Query(f"sum by (target) (rate(loadgen_output_tokens_total[{RATE}]))", "{{target}}"),),
          unit="none", source="loadgen"),
    Panel("Requests/s: sent vs completed",
          "rate() of loadgen_requests_sent_total (the load offered) and loadgen_requests_completed_total "
          "(what the server got through). A gap that stays open is a backlog.",
          (Query(f"sum by (target) (rate(loadgen_requests_sent_total[{RATE}]))", "{{target}} sent"),
           Query(f"sum by (target) (rate(loadgen_requests_completed_total[{RATE}]))", "{{target}} completed")),
          unit="reqps", source="loadgen"),
    Panel("Latency percentiles",
          "End-to-end request latency from loadgen_latency_seconds: p50, p90, p99 over the rate window, "
          "from the intended send (waiting for a slot included).",
          _quantiles("loadgen_latency_seconds", "latency"), unit="s", source="loadgen"),
    Panel("Time to first token and inter-token latency",
          "Streaming runs only: TTFT (slot wait and prefill included) and the gap between content chunks, "
          "p50 and p99 from loadgen_time_to_first_token_seconds and loadgen_inter_token_latency_seconds.",
          (*_quantiles("loadgen_time_to_first_token_seconds", "TTFT", (0.5, 0.99)),
           *_quantiles("loadgen_inter_token_latency_seconds", "ITL", (0.5, 0.99))), unit="s", source="loadgen"),
    Panel("Queue wait",
          "loadgen_queue_wait_seconds, p50 and p99: latency minus the server's prompt_ms and predicted_ms, "
          "the time a request waited for a slot (plus a few ms of HTTP).",
          _quantiles("loadgen_queue_wait_seconds", "queue wait", (0.5, 0.99)), unit="s", source="loadgen"),
    Panel("Errors by kind",
          "rate() of loadgen_requests_failed_total by error_kind (timeout, disconnected, http_500, ...). "
          "Flat at 0 in a clean run.",
          (Query(f"sum by (target, error_kind) (rate(loadgen_requests_failed_total[{RATE}]))",
                 "{{target}} {{error_kind}}"),), unit="reqps", source="loadgen"),
    Panel("In flight vs slots",
          "Requests loadgen has in flight, against the slots /slots shows busy and the slots there are. "
          "In flight above the slot count is the queue the server defers.",
          (Query("loadgen_requests_in_flight", "{{target}} in flight"),
           Query("loadgen_slots_busy", "{{target}} busy slots"),
           Query("loadgen_slots_total", "{{target}} slots")), source="loadgen"),
    Panel("Level",
          "loadgen_level: the concurrency (or request rate, open loop) loadgen is running now; each change "
          "is also marked on every panel as an annotation.",
          (Query("loadgen_level", "{{target}}"),), source="loadgen"),
    Panel("Slot context used",
          "loadgen_slot_context_tokens: tokens of context each slot's running task holds (prompt + decoded), "
          "re-exported from /slots so no dashboard has to scrape it.",
          (Query("loadgen_slot_context_tokens", "{{target}} slot {{slot}}"),), source="loadgen"),
    Panel("Draft acceptance and reasoning share",
          "Speculative decoding: accepted / drafted tokens of loadgen's completed requests (from "
          "loadgen_spec_decode_num_accepted_tokens_total and _draft_tokens_total; no line when the server drafts "
          "nothing). Reasoning models: reasoning / output tokens (loadgen_reasoning_tokens_total).",
          (Query(f"sum by (target) (rate(loadgen_spec_decode_num_accepted_tokens_total[{RATE}])) / "
                 f"sum by (target) (rate(loadgen_spec_decode_num_draft_tokens_total[{RATE}]))",
                 "{{target}} draft acceptance"),
           Query(f"sum by (target) (rate(loadgen_reasoning_tokens_total[{RATE}])) / "
                 f"sum by (target) (rate(loadgen_output_tokens_total[{RATE}]))", "{{target}} reasoning share")),
          unit="percentunit", source="loadgen"),
    Panel("SLO attainment (--slo)",
          "Runs with --slo only: the share of each level's judged requests that met every latency target "
          "so far (loadgen_slo_attainment_ratio), against the share a level must reach "
          "(loadgen_slo_attainment_required_ratio, --attainment). A level below the line fails.",
          (Query("loadgen_slo_attainment_ratio", "{{target}} level {{level}}"),
           Query("loadgen_slo_attainment_required_ratio", "required")),
          unit="percentunit", source="loadgen"),
    Panel("Goodput vs completed (--slo)",
          "Runs with --slo only: rate() of loadgen_requests_good_total (requests that met every latency "
          "target: the goodput) against rate() of loadgen_requests_completed_total. The gap is the "
          "requests that succeeded too late.",
          (Query(f"sum by (target) (rate(loadgen_requests_good_total[{RATE}]))", "{{target}} good"),
           Query(f"sum by (target) (rate(loadgen_requests_completed_total[{RATE}]))", "{{target}} completed")),
          unit="reqps", source="loadgen"),
    Panel("Energy per token (--environment)",
          "Machines with RAPL or NVML energy counters: each level's joules per output token so far "
          "(loadgen_joules_per_token, gross) by energy source; at the level's end it equals run.json's.",
          (Query("loadgen_joules_per_token", "{{target}} level {{level}} {{source}}"),), source="loadgen"),
    Panel("Power (--environment)",
          "rate() of loadgen_energy_joules_total: the watts the machine drew while loadgen ran, by energy "
          "source (cpu: RAPL packages, gpu: NVML, total: both).",
          (Query(f"sum by (target, source) (rate(loadgen_energy_joules_total[{RATE}]))", "{{target}} {{source}}"),),
          unit="watt", source="loadgen"),
    Panel("Client load",
          "Is loadgen itself the bottleneck? rate() of loadgen_client_cpu_seconds_total (1 = a whole core) "
          "and the p99 of loadgen_event_loop_lag_seconds.",
          (Query(f"rate(loadgen_client_cpu_seconds_total[{RATE}])", "CPU (cores)"),
           Query(f"histogram_quantile(0.99, sum by (le) (rate(loadgen_event_loop_lag_seconds_bucket[{RATE}])))",
                 "event-loop lag p99 (s)")), source="loadgen"),
)

PANELS = SERVER_PANELS + LOADGEN_PANELS
# Marks each level change on every panel.
LEVEL_ANNOTATION = Query("changes(loadgen_level[1m]) > 0", "{{target}} level changed")


@dataclass
class DashboardSpec:
    title: str = "loadgen: servers and load"
    targets: list[str] = field(default_factory=list)  # the run's target labels (the description names them)
    refresh: str = "5s"


def dashboard(spec: DashboardSpec) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a dict), datasource as a template variable."""
    try:
        from grafana_foundation_sdk.builders import common as gc
        from grafana_foundation_sdk.builders import dashboard as gd
        from grafana_foundation_sdk.builders import prometheus, timeseries
        from grafana_foundation_sdk.cog.encoder import JSONEncoder
        from grafana_foundation_sdk.models import common as gcm
        from grafana_foundation_sdk.models import dashboard as gm
    except ImportError:
        raise UserError("the Grafana dashboard is built with grafana-foundation-sdk, a dependency of loadgen "
                        "missing here: pip install grafana-foundation-sdk") from None
    source = gm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
    board = (gd.Dashboard(spec.title).uid(DASHBOARD_UID).tags(["loadgen", "llama.cpp"]).refresh(spec.refresh)
             .time("now-30m", "now").tooltip(gm.DashboardCursorSync.CROSSHAIR)
             .description("llama-server /metrics and loadgen's live metrics; targets: " + ", ".join(spec.targets))
             .with_variable(gd.DatasourceVariable(DATASOURCE_VARIABLE).label("Prometheus").type("prometheus"))
             .annotation(gd.AnnotationQuery().name("level changes").datasource(source).enable(True)
                         .icon_color("orange").expr(LEVEL_ANNOTATION.expr)))
    panel_id = 0
    for row_title, panels in (("llama-server (/metrics)", SERVER_PANELS), ("loadgen (live metrics)", LOADGEN_PANELS)):
        panel_id += 1
        board = board.with_row(gd.Row(row_title).id(panel_id))
        for p in panels:
            panel_id += 1
            built = (timeseries.Panel().id(panel_id).title(p.title).description(p.description).datasource(source)
                     .unit(p.unit).height(8).span(p.width)
                     .legend(gc.VizLegendOptions().display_mode(gcm.LegendDisplayMode.TABLE)
                             .placement(gcm.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
                     .tooltip(gc.VizTooltipOptions().mode(gcm.TooltipDisplayMode.MULTI)
                              .sort(gcm.SortOrder.DESCENDING)))
            for i, q in enumerate(p.queries):
                built = built.with_target(prometheus.Dataquery().expr(q.expr).legend_format(q.legend)
                                          .ref_id(chr(ord("A") + i)).range())
            board = board.with_panel(built)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def dashboard_json(spec: DashboardSpec) -> bytes:
    return (json.dumps(dashboard(spec), indent=2) + "\n").encode()
