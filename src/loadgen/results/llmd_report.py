"""A run's levels as llm-d's common benchmark report (llm-d-benchmark's `workload/report`, version 0.2),
so loadgen's results can be compared with other harnesses' (issue 49; `loadgen share` adds them). Pure:
a run.json document in, one report per target and level out.

A report describes one point of a sweep (llm-d's README: "a benchmark report currently describes a
single point in any sweep"), so each level of each target is one report. What is filled, from the
level's own figures (run.json's names, docs/metrics.md):

    run.uid / eid           <run started_utc>/<label>/<level>, and the run's started_utc (one experiment)
    run.time                the run's start and end (ISO 8601), the level's wall time as an ISO duration
    scenario.load           tool "loadgen" and its version; concurrency or rate_qps; the input length
                            (the mean prompt_n, else --prompt-tokens, else input tokens per request;
                            0 where none is known: the field is required) and output length (n_predict);
                            Native.args: the run's config as loadgen wrote it
    results...requests      total (ok + failed + cancelled), failures, incomplete (cancelled),
                            input_length (prompt_n) and output_length (predicted_n), counts
    results...latency       time_to_first_token (ttft_ms), time_per_output_token (tpot_ms),
                            inter_token_latency (itl_ms), request_latency (latency_ms): ms, ms/token
    results...throughput    output_token_rate (throughput_tok_s), total_token_rate (total_tok_s),
                            input_token_rate (their difference), requests_rate (request_rate, qps)

A statistic loadgen has no value for is left out (the schema makes every one optional); `run.user`
and the stack (`scenario.stack`: llm-d's component descriptions of a Kubernetes deployment) are never
filled. Percentiles keep loadgen's names where llm-d has the same one (p50, p90, p99, max).
"""

from __future__ import annotations

from typing import Any

VERSION = "0.2"
TOOL = "loadgen"
_PERCENTILES = ("p50", "p90", "p99", "max", "min", "p95", "p75", "p25", "p10", "p5", "p1")


def statistics(dist: Any, units: str) -> dict[str, Any] | None:
    """A loadgen distribution ({count, mean, p50, ...}) as llm-d's Statistics; None without a mean."""
    if not isinstance(dist, dict) or not isinstance(dist.get("mean"), (int, float)):
        return None
    out: dict[str, Any] = {"units": units, "mean": float(dist["mean"])}
    for key in ("stddev", "sd"):
        if isinstance(dist.get(key), (int, float)):
            out["stddev"] = float(dist[key])
    out.update({p: dist[p] for p in _PERCENTILES if isinstance(dist.get(p), (int, float))})
    return out


def _iso_duration(seconds: float | None) -> str | None:
    return None if not isinstance(seconds, (int, float)) else f"PT{seconds:.3f}S"


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _load(doc: dict[str, Any], level: dict[str, Any]) -> dict[str, Any]:
    config = doc.get("config") or {}
    prompt, ok = statistics(level.get("prompt_n"), "count"), level.get("requests_ok") or 0
    input_len = (prompt["mean"] if prompt else config.get("prompt_tokens") or
                 (level["input_tokens"] / ok if isinstance(level.get("input_tokens"), int) and ok else 0))
    n_predict = config.get("n_predict")
    standardized = _drop_none({
        "tool": TOOL, "tool_version": str(doc.get("loadgen_version") or "unknown"),
        "input_seq_len": {"distribution": "other", "value": input_len},
        "output_seq_len": {"distribution": "fixed", "value": n_predict} if isinstance(n_predict, int) else None,
        "rate_qps": level.get("rate") if isinstance(level.get("rate"), (int, float)) else None,
        "concurrency": level.get("level") if isinstance(level.get("level"), int) else None,
    })
    return {"metadata": {"schema_version": "0.0.1", "description": f"loadgen {doc.get('kind') or 'sweep'}"},
            "standardized": standardized, "Native": {"args": {k: v for k, v in config.items() if v is not None}}}


def _aggregate(level: dict[str, Any]) -> dict[str, Any]:
    ok, failed = int(level.get("requests_ok") or 0), int(level.get("requests_failed") or 0)
    cancelled = int(level.get("requests_cancelled") or 0)
    requests = _drop_none({"total": ok + failed + cancelled, "failures": failed, "incomplete": cancelled,
                           "input_length": statistics(level.get("prompt_n"), "count"),
                           "output_length": statistics(level.get("predicted_n"), "count")})
    latency = _drop_none({"time_to_first_token": statistics(level.get("ttft_ms"), "ms"),
                          "time_per_output_token": statistics(level.get("tpot_ms"), "ms/token"),
                          "inter_token_latency": statistics(level.get("itl_ms"), "ms/token"),
                          "request_latency": statistics(level.get("latency_ms"), "ms")})
    out_rate, total_rate = level.get("throughput_tok_s"), level.get("total_tok_s")

    def rate(value: Any, units: str) -> dict[str, Any] | None:
        return {"units": units, "mean": float(value)} if isinstance(value, (int, float)) else None

    in_rate = (total_rate - out_rate if isinstance(out_rate, (int, float)) and isinstance(total_rate, (int, float))
               else None)
    throughput = _drop_none({"input_token_rate": rate(in_rate, "token/s"),
                             "output_token_rate": rate(out_rate, "token/s"),
                             "total_token_rate": rate(total_rate, "token/s"),
                             "requests_rate": rate(level.get("request_rate"), "qps")})
    return _drop_none({"requests": requests, "latency": latency or None, "throughput": throughput or None})


def level_report(doc: dict[str, Any], label: str, level: dict[str, Any]) -> dict[str, Any]:
    """One target's level as a version 0.2 report."""
    started = doc.get("started_utc")
    point = level.get("level") if level.get("level") is not None else f"{level.get('rate')}rps"
    return {
        "version": VERSION,
        "run": _drop_none({"uid": f"{started}/{label}/{point}", "eid": str(started),
                           "time": _drop_none({"start": started, "end": doc.get("finished_utc"),
                                               "duration": _iso_duration(level.get("wall_s"))})}),
        "scenario": {"load": _load(doc, level)},
        "results": {"request_performance": {"aggregate": _aggregate(level)}},
    }


def llmd_reports(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(a file name, the report) per target and level of a run document, in run order."""
    out = []
    for target in doc.get("targets") or []:
        label = str(target.get("label") or "target")
        for level in target.get("levels") or []:
            point = (f"c{level['level']}" if level.get("level") is not None else f"r{level.get('rate')}")
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
            out.append((f"{safe}-{point}.json", level_report(doc, label, level)))
    return out
