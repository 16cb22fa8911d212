"""Trace replay: a recorded trace's requests, each sent at its trace time with its lengths.

Two trace formats, one request per line (JSONL) or row (CSV, with a header):

    Mooncake   {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}
               (the FAST'25 traces; hash_ids name the prompt's 512-token blocks)
    plain      time (seconds), input (tokens), output (tokens): JSONL keys or CSV columns

`plan_replay` turns the requests into an open-loop schedule and one `RequestShape` per request:
times are relative to the first request and divided by `speed`; lengths are multiplied by
`scale_lengths`, rounded and clamped (`max_prompt`, `max_output`; a prompt is at least
`min_prompt`), so a trace recorded on a large-context server fits a small one. The schedule runs
on the rate mode's open loop (run/engine.run_open_level): latency counts from each request's
trace time, so a server that falls behind cannot hide it (coordinated omission).

Prompts are built block by block (run/trace_prompts.py): each hash id stands for a fixed text of
`block_tokens` tokens (512 × scale_lengths), a request's prompt starts with the texts of its
blocks, then the salt, then text up to its exact length. So requests that share blocks in the
trace share that prefix on the wire. The shape's `prefix_id` is its first block.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from typing import Any

from ..core.errors import ConfigError
from ..core.workload import RequestShape
from .prompts import read_text_file

BLOCK_TOKENS = 512  # Mooncake's hash_ids name blocks of this many prompt tokens


@dataclass(frozen=True, slots=True)
class TraceRequest:
    at_ms: float  # when it was sent, ms from any origin
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def _number(row: dict[str, Any], key: str, where: str) -> float:
    value = row.get(key)
    try:
        number = float(value)  # type: ignore[arg-type]  # a non-number is caught just below
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key!r} is {value!r}, not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{where}: {key!r} is {value!r}, not a non-negative number")
    return number


def _request(row: dict[str, Any], where: str) -> TraceRequest:
    if "timestamp" in row:  # Mooncake
        hashes = row.get("hash_ids") or []
        if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
            raise ConfigError(f"{where}: 'hash_ids' is not a list of integers")
        return TraceRequest(_number(row, "timestamp", where), int(_number(row, "input_length", where)),
                            int(_number(row, "output_length", where)), tuple(hashes))
    if "time" in row:
        return TraceRequest(_number(row, "time", where) * 1000, int(_number(row, "input", where)),
                            int(_number(row, "output", where)))
    raise ConfigError(f"{where}: neither a Mooncake line (timestamp, input_length, output_length, hash_ids) "
                      "nor a plain one (time, input, output)")


def read_trace(path: str) -> list[TraceRequest]:
    """Every request of a trace file, in file order (ConfigError names the line of a bad one)."""
    text = read_text_file(path, "the trace")
    if path.lower().endswith(".csv"):
        rows = csv.DictReader(io.StringIO(text))
        return [_request({k.strip(): v for k, v in row.items() if k}, f"{path}:{n}") for n, row in enumerate(rows, 2)]
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n}: not a JSON line") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{n}: not a JSON object")
        out.append(_request(row, f"{path}:{n}"))
    if not out:
        raise ConfigError(f"the trace {path} holds no request")
    return out


@dataclass(frozen=True, slots=True)
class Replay:
    """A trace made ready to send: per request its offset from the start (ns) and its shape."""

    offsets_ns: tuple[int, ...]
    shapes: tuple[RequestShape, ...]
    source: dict[str, Any]  # the trace's name and the transformation, for run.json
    hash_ids: tuple[tuple[int, ...], ...] = ()  # per request, its blocks (Mooncake); () for none
    block_tokens: int = BLOCK_TOKENS  # a block's tokens after --scale-lengths

    @property
    def rate(self) -> float:
        """The mean rate the schedule offers, requests/s: (n − 1) / (last offset − first); 1 when
        the trace has one request or all at one time. The level's key in the results."""
        span_s = (self.offsets_ns[-1] - self.offsets_ns[0]) / 1e9 if self.offsets_ns else 0.0
        return round((len(self.offsets_ns) - 1) / span_s, 6) if span_s > 0 else 1.0


def _scaled(value: int, scale: float, low: int, high: int | None) -> int:
    n = max(low, round(value * scale))
    return n if high is None else min(n, high)


def plan_replay(requests: list[TraceRequest], *, name: str = "trace", speed: float = 1.0,
                scale_lengths: float = 1.0, max_prompt: int | None = None, max_output: int | None = None,
                min_prompt: int = 1, limit: int | None = None) -> Replay:
    """The schedule and shapes of a trace (see the module docstring). Requests are taken in time
    order (ties in file order), the first `limit` of them."""
    if speed <= 0 or not math.isfinite(speed):
        raise ConfigError(f"--speed {speed}: must be a positive factor")
    if scale_lengths <= 0 or not math.isfinite(scale_lengths):
        raise ConfigError(f"--scale-lengths {scale_lengths}: must be a positive factor")
    ordered = sorted(requests, key=lambda r: r.at_ms)[:limit]
    first = ordered[0].at_ms
    offsets = tuple(round((r.at_ms - first) / speed * 1e6) for r in ordered)
    shapes = tuple(RequestShape(_scaled(r.input_tokens, scale_lengths, min_prompt, max_prompt),
                                _scaled(r.output_tokens, scale_lengths, 1, max_output),
                                prefix_id=r.hash_ids[0] if r.hash_ids else None) for r in ordered)
    source = {"trace": name, "requests": len(ordered), "speed": speed, "scale_lengths": scale_lengths,
              "max_prompt_tokens": max_prompt, "max_n_predict": max_output}
    return Replay(offsets, shapes, source, tuple(r.hash_ids for r in ordered),
                  max(1, round(BLOCK_TOKENS * scale_lengths)))
