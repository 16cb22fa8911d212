"""What the parent and a worker process (`--workers`) say to each other over the worker's stdin/stdout.

Each message is a msgpack frame behind a 4-byte big-endian length. Per level: the parent sends
`Prepare` (the target, the request shape and the process's `Share`), the worker opens what it needs
and answers `Ready`; once every worker is ready the parent sends `Go` with one start time on the
machine's monotonic clock (the barrier: levels start together), and the worker answers `LevelDone`
when its share has ended. `Stop` ends a level early (Ctrl-C), its in-flight requests recorded as
cancelled. Records do not travel here: the worker appends them to its records file as they complete,
and sends the figures of each batch of them as a `WorkerPartial` (the parent adds figures, it does
not read records).
"""

from __future__ import annotations

import asyncio
import struct

import msgspec

from ...analysis.aggregate import Partial
from ...client.backends import GenerationParams
from ...core.records import RequestRecord
from .merge import Share

_LENGTH = struct.Struct(">I")


class Prepare(msgspec.Struct, tag="prepare"):
    url: str
    label: str
    api: str
    model: str | None
    generation: GenerationParams
    transport: str
    timeout_s: float
    stall_s: float | None
    headers: dict[str, str]
    insecure: bool
    close_streams: bool
    pool: int  # connections for the whole run (0: no limit)
    decimal_salt: bool  # exact prompt lengths: salts of decimal digits
    give_up_after: int | None
    level: int | float  # the level's key: concurrency or rate
    rate: float | None
    prompt_tokens: int | None
    share: Share
    duration_s: float | None
    records_path: str
    pause_after_connect_error_s: float = 0.0  # see engine.EngineOptions
    connect_ahead: int = 0  # connections to open before the level's clock starts (Transport.connect_ahead)


class Go(msgspec.Struct, tag="go"):
    start_ns: int


class Stop(msgspec.Struct, tag="stop"):
    pass


class Ready(msgspec.Struct, tag="ready"):
    pid: int
    host: str
    error: str | None = None


class LevelDone(msgspec.Struct, tag="done"):
    start_ns: int
    end_ns: int
    stopped_reason: str | None
    records: int
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    client_cpu_fraction: float | None
    read_clock: str | None
    sample: list[RequestRecord]  # the worker's uniform sample of its records (aggregate.merge_samples)


class WorkerPartial(msgspec.Struct, tag="partial"):
    """The figures of the records a worker wrote since its last part (`aggregate.Partial`); `offset`:
    the bytes of its records file (or buffer) that its parts so far cover; `sends`: what it had sent
    and had in flight then (`merge.SendsSoFar`, msgpack; empty in a level's last part), decoded
    only if the worker dies (`merge.lost_requests`)."""

    part: Partial
    offset: int
    sends: bytes = b""


# A last part's watermark: the worker sends nothing more in this level.
NO_MORE_SENDS = 2**62

ToWorker = Prepare | Go | Stop
FromWorker = Ready | LevelDone | WorkerPartial

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


def frame(message: ToWorker | FromWorker) -> bytes:
    payload = _encoder.encode(message)
    return _LENGTH.pack(len(payload)) + payload


async def read_frame(reader, decoder: msgspec.msgpack.Decoder) -> object | None:
    """The next message from an asyncio StreamReader; None at the end of the stream."""
    try:
        head = await reader.readexactly(_LENGTH.size)
        return decoder.decode(await reader.readexactly(_LENGTH.unpack(head)[0]))
    except asyncio.IncompleteReadError:
        return None


async def read_to_worker(reader) -> ToWorker | None:
    return await read_frame(reader, _to_worker)  # type: ignore[return-value]  # the decoder's type is ToWorker


async def read_from_worker(reader) -> FromWorker | None:
    return await read_frame(reader, _from_worker)  # type: ignore[return-value]  # the decoder's type is FromWorker
