"""A run's levels stream their records: to the run's records file, and into each level's aggregate;
the probe's samples stream to theirs (`probe_stream`).

`stream_level` is called for every level a run records (sweep levels, soak, prefill and depth
steps). Without a sink (a run driven from Python, as tests do) a level keeps a plain list.
"""

from __future__ import annotations

from collections.abc import Callable

from ..analysis.aggregate import LevelAggregate
from ..core.clock import now_ns
from ..core.records import LevelRun, ProbeSample, simulated_record, simulated_sample
from ..core.recordsink import Batch, LevelRecords, RecordSink


def stream_level(level: LevelRun, sink: RecordSink | None, *, keep: bool = False, time_scale: float = 1.0,
                 origin_ns: int = 0, extra: list[Callable[[Batch], None]] | None = None) -> LevelRun:
    """Send `level`'s records to `sink` and a fresh `LevelAggregate` (`level.aggregate`) batch by batch.

    keep: the level also keeps its records in memory (prefill and depth steps). time_scale: records
    are moved to simulated time before they are written (demo); `extra`: more consumers (a soak's windows).
    """
    if sink is None:
        return level
    aggregate = level.aggregate = LevelAggregate()
    scaled = time_scale != 1.0

    def gather(batch: Batch) -> None:
        aggregate.add_batch(batch)
        # in_flight holds real times: the sweep is safe only on the records' own clock, and only when
        # this process sent the requests (a worker's record can come after later-sent ones)
        if not scaled and not level.remote:
            aggregate.settle(min((v[2] for v in level.in_flight.values()), default=now_ns()))

    consumers: list[Callable[[Batch], None]] = [gather, sink.write, *(extra or [])]
    if scaled:
        inner = list(consumers)

        def move(batch: Batch) -> None:
            moved = [simulated_record(r, time_scale, origin_ns) for r in batch]
            for consume in inner:
                consume(moved)
        consumers = [move]
    direct = sink.takes_lines and not keep and not extra and not scaled
    level.records = LevelRecords(consumers, keep=keep, encoded=sink if direct else None)
    return level


def probe_stream(sink: RecordSink | None, *, time_scale: float = 1.0,
                 origin_ns: int = 0) -> Callable[[ProbeSample], None] | None:
    """Where each probe sample goes as it is scraped: to `sink` (probe.jsonl), one write per scrape
    (a scrape every 25 ms at the densest: one small write on the sink's thread); in simulated time
    when `time_scale` is not 1 (demo). None without a sink."""
    if sink is None:
        return None
    if time_scale == 1.0:
        return lambda sample: sink.write_samples((sample,))
    return lambda sample: sink.write_samples((simulated_sample(sample, time_scale, origin_ns),))
