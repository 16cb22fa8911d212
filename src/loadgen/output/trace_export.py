"""A run exported as a trace (`loadgen export RUN --format trace`), so a production-like run can be
replayed against another configuration (`loadgen replay`, run/trace_replay.py).

One Mooncake-format JSONL file per target, `trace-<label>.jsonl`, one line per request that the
client sent (cancelled and lost ones left out), in the order they were due:

    {"timestamp": ms since the target's first request was due, "input_length": its prompt tokens,
     "output_length": its answer tokens, "hash_ids": []}

The lengths are what the request asked for when the run recorded it (`prompt_tokens_target`,
`n_predict_target`), else what the server counted (`prompt_n` or usage, the output tokens); a
request with neither prompt count is left out. No blocks are known, so `hash_ids` is empty.
"""

from __future__ import annotations

import json
from typing import Any

from ..core import records as rec
from ..core.records import RequestRecord
from .files import file_safe


def _line(r: RequestRecord, origin_ns: int) -> dict[str, Any] | None:
    prompt = r.prompt_tokens_target or r.prompt_n or (r.usage.prompt_tokens if r.usage else None)
    answer = r.n_predict_target or r.output_tokens
    if not prompt or r.error_kind in rec.CLIENT_SIDE:
        return None
    return {"timestamp": round((r.start_ns - origin_ns) / 1e6, 3), "input_length": prompt,
            "output_length": answer or 1, "hash_ids": []}


class TraceExporter:
    """trace-<label>.jsonl per target: its requests as a replayable trace (see the module docstring)."""

    name = "trace"

    def render(self, data: Any) -> list[tuple[str, bytes]]:
        files = []
        for t in data.targets:
            mine = sorted((r for r in data.records if r.target == t.label), key=lambda r: (r.start_ns, r.seq))
            if not mine:
                continue
            lines = [line for r in mine if (line := _line(r, mine[0].start_ns)) is not None]
            files.append((f"trace-{file_safe(t.label)}.jsonl",
                          "".join(json.dumps(line) + "\n" for line in lines).encode("utf-8")))
        return files
