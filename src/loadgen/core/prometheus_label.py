"""A target's label as a Prometheus label value (`target` on loadgen's live series, `alias` on
llama-server's in the prometheus.yml `loadgen observe` writes).

Any UTF-8 is a valid label value, but loadgen's display labels carry "…" (a shortened model name)
and "@port" or "#2" (targets told apart), which are awkward to type in a PromQL selector. The value
keeps ASCII letters, digits, "_", ".", ":" and "-"; every other run of characters becomes one "-";
it is at most MAX_VALUE characters. Both places use this one function, so a series of loadgen's and
one of the server's name a target the same way.
"""

from __future__ import annotations

import re

MAX_VALUE = 48
_OTHER = re.compile(r"[^A-Za-z0-9_.:-]+")


def label_value(label: str) -> str:
    """"SmolLM2…Q4_1@8081" -> "SmolLM2-Q4_1-8081"; "target" when nothing typeable is left."""
    value = _OTHER.sub("-", label).strip("-")[:MAX_VALUE].rstrip("-")
    return value or "target"
