"""A server waking from sleep (`loadgen wake`, llama-server's `--sleep-idle-seconds`): what a
request that arrives while it sleeps pays, pure.

Each cycle (run/wake.py) sends requests to the awake server (warm), waits until /props says
`is_sleeping`, and sends as many to the sleeping server (cold): the first of them wakes it, which
reloads the model. The reload happens before the prefill, so it shows in the part of TTFT that
is not the server's prompt_ms (the wait: TTFT less prompt_ms), and the prefill's own spread,
large on a busy machine, stays out of it. A cycle's wake cost is its cold median wait less its
warm median wait; the target's is the median over the cycles in which the server slept.

The verdict (`wake_verdict`), first match:

    interrupted the run was stopped before its first cycle ended
    failed      no cycle ran, a request of a cycle failed (a server answering 503 while it
                reloads is a finding), or a slept cycle has no wait to compare (no TTFT or
                no prompt_ms)
    no sleep    the server never said is_sleeping within the idle wait (not started with
                --sleep-idle-seconds, or a longer one than --idle)
    wake costs  the wake cost is at least WAKE_FLOOR_MS and at least the warm wait (the cold
                requests waited outside the prefill at least twice as long as the warm ones)
    no cost     the server slept and woke, and the cold requests did not wait beyond that
"""

from __future__ import annotations

import statistics

from ..core.rundoc import WakeCycle, WakeSection

WAKE_COSTS, NO_COST, NO_SLEEP, FAILED = "wake costs", "no cost", "no sleep", "failed"
INTERRUPTED = "interrupted"  # stopped (Ctrl-C) before any cycle ended: nothing to judge
VERDICTS = (WAKE_COSTS, NO_COST, NO_SLEEP, FAILED, INTERRUPTED)
WAKE_FLOOR_MS = 50.0  # below this a cold request's extra wait is a scheduling hiccup, not a reload


def cycle_cost_ms(c: WakeCycle) -> float | None:
    """A slept cycle's cold median wait less its warm one; None without both (or without a sleep)."""
    if not c.slept or c.cold_wait_ms is None or c.warm_wait_ms is None:
        return None
    return c.cold_wait_ms - c.warm_wait_ms


def wake_verdict(cycles: list[WakeCycle], idle_s: float, interrupted: bool = False) -> tuple[str, str, float | None]:
    """(verdict, why in one sentence, the wake cost in ms or None); see the module's docstring. An
    interrupted run is judged on the cycles that ended."""
    if not cycles:
        return (INTERRUPTED, "stopped before the first cycle ended (its requests are in requests.jsonl)", None) \
            if interrupted else (FAILED, "no cycle ran", None)
    failed = [c for c in cycles if c.failed]
    if failed:
        n = sum(c.failed for c in failed)
        return FAILED, f"{n} request(s) failed around a sleep (cycle {failed[0].cycle}: {failed[0].error})", None
    slept = [c for c in cycles if c.slept]
    if not slept:
        return NO_SLEEP, (f"the server never said is_sleeping within --idle {idle_s:g} s: start it with "
                          "--sleep-idle-seconds shorter than that"), None
    costs = [cycle_cost_ms(c) for c in slept]
    if any(cost is None for cost in costs):
        return FAILED, "a cycle in which the server slept has no wait to compare (TTFT less prompt_ms)", None
    cost = statistics.median([c for c in costs if c is not None])
    warm = statistics.median([c.warm_wait_ms for c in slept if c.warm_wait_ms is not None])
    of = f"{len(slept)} of {len(cycles)} cycles slept" if len(slept) < len(cycles) else \
        f"median of {len(slept)} wake(s)"
    if cost >= WAKE_FLOOR_MS and cost >= warm:
        return WAKE_COSTS, (f"a request that finds the server asleep waits {cost:,.0f} ms more for its first "
                            f"token outside the prefill ({of}; warm {warm:,.0f} ms){_prefill(slept)}"), cost
    return NO_COST, (f"the server slept and woke, the cold requests' wait outside the prefill {cost:+,.0f} ms "
                     f"against warm ({of})"), cost


def _prefill(slept: list[WakeCycle]) -> str:
    """The server's prefill cold against warm, when it said both: the wait is outside the prompt."""
    cold = [c.cold_prompt_ms for c in slept if c.cold_prompt_ms is not None]
    warm = [c.warm_prompt_ms for c in slept if c.warm_prompt_ms is not None]
    if not cold or not warm:
        return ""
    return (f"; the server's own prefill (prompt_ms cold {statistics.median(cold):,.0f}, warm "
            f"{statistics.median(warm):,.0f} ms) is left out of it")


def wake_section(cycles: list[WakeCycle], concurrency: int, idle_s: float, interrupted: bool = False) -> WakeSection:
    """A target's run.json section: its cycles with the verdict over them."""
    verdict, why, cost = wake_verdict(cycles, idle_s, interrupted)
    if interrupted and cycles:
        why += f" (stopped after {len(cycles)} cycle(s))"
    return WakeSection(rows=list(cycles), concurrency=concurrency, idle_s=idle_s,
                       wakes=sum(c.slept for c in cycles), wake_ms=cost, verdict=verdict, why=why)
