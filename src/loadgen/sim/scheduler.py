"""Slots, the FIFO deferred queue, and the one loop that drives every decode call.

It follows llama-server's `update_slots()`. Each turn of the loop:

1. releases the slots of cancelled tasks (a client that went away);
2. admits waiting tasks in arrival order, deferred ones first: a task gets an idle slot (see
   _pick_slot) or is deferred (`requests_deferred`) until one frees up. A prompt of n_ctx tokens
   or more is refused here, once it has a slot, as llama-server does;
3. builds one batch: one token for every generating slot, then prompt tokens of the slots still
   in their prompt, in slot order, up to n_batch tokens in all (a longer prompt takes several
   batches, and the generating slots advance one token with each of them);
4. "runs" it for  step_ms(b) + prompt_tokens * 1000 / prefill_tok_s  model milliseconds, with
   b = generating slots in the batch (0 -> no decode term), see Profile;
5. samples: each generating slot gets a token; a slot whose prompt is complete samples its first
   token from this batch's logits (that ends its prompt_ms and starts its predicted_ms).

Time. Model milliseconds are multiplied by `time_scale` and slept on the loop's monotonic clock.
Batch deadlines are laid end to end (a late wake-up shortens the next sleep instead of adding up),
unless the loop falls more than LATE_LIMIT_NS behind, when it starts afresh from now. Every
reported time (prompt_ms, predicted_ms, the /metrics seconds) is measured on that clock, like the
real server's wall-clock timings: at time_scale s they are about s times the model's times, and a
client's latency is about queue wait + prompt_ms + predicted_ms + HTTP.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from ..core.clock import NS_PER_MS, now_ns
from .host_cache import HostPromptCache, common_prefix
from .metrics import ServerMetrics
from .params import CompletionParams
from .profile import Profile
from .task import CompletionResult, ErrorEvent, FinalEvent, Task, Timings, TokenEvent
from .tokenizer import EOS_TOKEN, TextSource

# Past this much lateness the loop stops catching up: a stall is not paid back as a burst of steps.
LATE_LIMIT_NS = 50 * NS_PER_MS
# llama-server's --slot-prompt-similarity default.
SLOT_PROMPT_SIMILARITY = 0.1
# A slot chosen by similarity that would keep less than this share of its tokens saves them first.
SAVE_BELOW_KEEP = 0.5


class SlotState(Enum):
    IDLE = "idle"
    PROMPT = "prompt"
    GENERATING = "generating"


@dataclass(slots=True)
class Slot:
    id: int
    n_ctx: int
    state: SlotState = SlotState.IDLE
    task: Task | None = None
    last_task: Task | None = None  # what /slots still shows after a release
    cache: list[int] = field(default_factory=list)  # token ids in this slot's KV cache
    t_last_used_ns: int = 0
    # Per task; reset when a task starts and when the slot is released.
    n_prompt_cached: int = 0
    n_prompt_processed: int = 0
    n_decoded: int = 0
    t_prompt_start_ns: int = 0
    t_first_token_ns: int = 0
    prompt_ms: float = 0.0
    text: str = ""  # generated text so far
    n_sent: int = 0  # characters of `text` already streamed
    tokens: list[int] = field(default_factory=list)
    pending_token: int = -1  # sampled, not yet decoded: it enters the KV with the next batch
    source: TextSource | None = None
    has_new_line: bool = False

    @property
    def is_processing(self) -> bool:
        return self.state is not SlotState.IDLE

    def n_remaining(self) -> int:
        if self.task is None or self.task.params.n_predict < 0:
            return -1
        return self.task.params.n_predict - self.n_decoded


@dataclass(frozen=True, slots=True)
class Batch:
    generating: tuple[Slot, ...]
    prompt_chunks: tuple[tuple[Slot, int], ...]  # (slot, prompt tokens of it in this batch)

    @property
    def n_prompt_tokens(self) -> int:
        return sum(n for _, n in self.prompt_chunks)


class Scheduler:
    def __init__(self, profile: Profile, n_slots: int, *, time_scale: float = 1.0, seed: int = 0,
                 metrics: ServerMetrics | None = None, cache_ram_tokens: int = 0):
        if n_slots < 1:
            raise ValueError("a server needs at least one slot")
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.profile = profile
        self.time_scale = time_scale
        self.seed = seed
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self.slots = [Slot(i, profile.n_ctx) for i in range(n_slots)]
        # --cache-ram: idle slots' prompts saved to host memory and restored (host_cache.py); None: off.
        self.host_cache = HostPromptCache(cache_ram_tokens) if cache_ram_tokens > 0 else None
        self._incoming: deque[Task] = deque()
        self._deferred: deque[Task] = deque()
        self._wake = asyncio.Event()
        self._next_task_id = 0
        self._batch_deadline_ns: int | None = None  # end of the last batch on the laid-out schedule
        self._stopped = False

    # --- the handlers' side --------------------------------------------------------------------

    def submit(self, params: CompletionParams) -> Task:
        task = Task(self._next_task_id, params, self.seed)
        self._next_task_id += 1
        if self._stopped:
            task.emit(_shutdown_error())
        else:
            self._incoming.append(task)
            self._wake.set()
        return task

    def cancel(self, task: Task) -> None:
        """The client is gone: drop the task if it waits, free its slot at the next turn if it runs."""
        task.cancelled = True
        for queue in (self._incoming, self._deferred):
            if task in queue:
                queue.remove(task)
        self._wake.set()

    @property
    def n_processing(self) -> int:
        return sum(slot.is_processing for slot in self.slots)

    @property
    def n_deferred(self) -> int:
        return len(self._deferred)

    def stop(self) -> None:
        """Answer every waiting or running task with an error, so no handler waits forever."""
        self._fail_all(_shutdown_error())

    def _fail_all(self, event: ErrorEvent) -> None:
        self._stopped = True
        for task in [*self._incoming, *self._deferred, *(s.task for s in self.slots if s.task)]:
            task.emit(event)
        self._incoming.clear()
        self._deferred.clear()
        self._wake.set()

    # --- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._loop()
        except Exception:
            # A bug in the simulator must not leave handlers waiting for events that never come.
            self._fail_all(ErrorEvent(500, {"code": 500, "message": "simulator error", "type": "server_error"}))
            raise

    async def _loop(self) -> None:
        while not self._stopped:
            self._release_cancelled()
            self._admit()
            if not any(slot.is_processing for slot in self.slots):
                self._batch_deadline_ns = None  # idle: the next batch starts when work arrives
                self._wake.clear()
                if not self._incoming:
                    await self._wake.wait()
                continue
            batch = self._build_batch()
            started_ns = now_ns()
            await self._run_for(self._batch_model_ms(batch))
            self._finish_batch(batch, started_ns)

    def _batch_model_ms(self, batch: Batch) -> float:
        """step_ms(b) for b generating slots (none: 0) + prompt tokens * 1000 / prefill_tok_s, + the
        profile's grammar_ms_per_token for each generating slot whose request is constrained."""
        decode_ms = self.profile.decode_step_ms(len(batch.generating)) if batch.generating else 0.0
        if self.profile.grammar_ms_per_token:
            constrained = sum(1 for slot in batch.generating if slot.task is not None and slot.task.params.constrained)
            decode_ms += self.profile.grammar_ms_per_token * constrained
        return decode_ms + self.profile.prefill_ms(batch.n_prompt_tokens)

    async def _run_for(self, model_ms: float) -> None:
        now = now_ns()
        start = self._batch_deadline_ns
        if start is None or now - start > LATE_LIMIT_NS:
            start = now
        deadline = start + round(model_ms * self.time_scale * NS_PER_MS)
        self._batch_deadline_ns = deadline
        # Always yield once, so the handlers run even when the loop is catching up.
        await asyncio.sleep(max(0, deadline - now) / 1e9)

    def _release_cancelled(self) -> None:
        now = now_ns()
        for slot in self.slots:
            if slot.task is not None and slot.task.cancelled:
                self._release(slot, now)

    def _admit(self) -> None:
        waiting = [*self._deferred, *self._incoming]
        self._deferred.clear()
        self._incoming.clear()
        now = now_ns()
        for task in waiting:
            slot = self._pick_slot(task)
            if slot is None:
                self._deferred.append(task)
            else:
                self._launch(slot, task, now)

    def _pick_slot(self, task: Task) -> Slot | None:
        """llama-server's get_available_slot: the requested slot; else the idle slot whose cache
        covers the largest share (> 10%) of the prompt; else the least recently used idle slot."""
        wanted = task.params.id_slot
        if 0 <= wanted < len(self.slots):
            slot = self.slots[wanted]
            return slot if not slot.is_processing else None
        idle = [slot for slot in self.slots if not slot.is_processing]
        prompt = task.params.prompt_tokens
        best, best_share = None, 0.0
        for slot in idle:
            share = _common_prefix(slot.cache, prompt) / len(prompt) if slot.cache and prompt else 0.0
            if share > best_share and share > SLOT_PROMPT_SIMILARITY:
                best, best_share = slot, share
        if best is not None or not idle:
            return best
        # Ties go to the highest slot id: llama-server compares with <= while scanning upwards.
        return min(reversed(idle), key=lambda slot: slot.t_last_used_ns)

    def _launch(self, slot: Slot, task: Task, now: int) -> None:
        prompt = task.params.prompt_tokens
        if not prompt:  # llama-server answers an empty prompt at once, with nothing generated
            task.id_slot, slot.last_task, slot.t_last_used_ns = slot.id, task, now
            task.emit(FinalEvent(CompletionResult("", (), slot.id, 0, 0, len(slot.cache), "none", "", False, False,
                                                  Timings(0, 0, 0.0, 0, 0.0))))
            return
        if len(prompt) >= slot.n_ctx:
            task.emit(ErrorEvent(400, {
                "code": 400,
                "message": f"request ({len(prompt)} tokens) exceeds the available context size "
                           f"({slot.n_ctx} tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": len(prompt),
                "n_ctx": slot.n_ctx,
            }))
            return
        if self.host_cache is not None and task.params.cache_prompt:
            self._swap_with_host(slot, task)
            self._save_idle_slots(slot)
        n_cached = _common_prefix(slot.cache, prompt) if task.params.cache_prompt else 0
        # The last prompt token is always computed: its logits give the first generated token.
        n_cached = min(n_cached, len(prompt) - 1)
        del slot.cache[n_cached:]
        self.metrics.on_cache_match(n_cached)
        task.id_slot = slot.id
        slot.state, slot.task, slot.last_task = SlotState.PROMPT, task, task
        slot.n_prompt_cached, slot.n_prompt_processed, slot.n_decoded = n_cached, 0, 0
        slot.t_prompt_start_ns, slot.t_first_token_ns, slot.prompt_ms = now, 0, 0.0
        slot.text, slot.n_sent, slot.tokens, slot.pending_token = "", 0, [], -1
        slot.source, slot.has_new_line = TextSource(task.rng), False

    def _swap_with_host(self, slot: Slot, task: Task) -> None:
        """llama-server with --cache-ram (get_available_slot): a slot taken as the least recently
        used, or by similarity but keeping under half of its tokens, saves them to the host cache,
        then restores the host's entry for the prompt when it beats the slot's own (host_cache.py).
        A slot requested by id that shares too little of the prompt does neither."""
        assert self.host_cache is not None
        prompt = task.params.prompt_tokens
        own = _common_prefix(slot.cache, prompt)
        if slot.cache and own / len(prompt) > SLOT_PROMPT_SIMILARITY:
            update = own / len(slot.cache) < SAVE_BELOW_KEEP
        else:
            update = not 0 <= task.params.id_slot < len(self.slots)
        if not update:
            return
        self.host_cache.save(slot.cache)
        restored = self.host_cache.take(prompt, slot.cache)
        if restored is not None:
            slot.cache = restored

    def _save_idle_slots(self, taken: Slot) -> None:
        """--cache-idle-slots (llama-server's default with --cache-ram): when a task starts, every
        other idle slot's tokens are saved to the host cache too; the slots keep them (separate KV per
        slot, as with --parallel; a unified KV cache would also clear them)."""
        assert self.host_cache is not None
        for slot in self.slots:
            if slot is not taken and not slot.is_processing and slot.cache:
                self.host_cache.save(slot.cache)

    def _build_batch(self) -> Batch:
        generating = tuple(slot for slot in self.slots if slot.state is SlotState.GENERATING)
        room = self.profile.n_batch - len(generating)
        chunks = []
        for slot in self.slots:
            if slot.state is SlotState.PROMPT and room > 0:
                assert slot.task is not None
                n = min(len(slot.task.params.prompt_tokens) - len(slot.cache), room)
                chunks.append((slot, n))
                room -= n
        return Batch(generating, tuple(chunks))

    def _finish_batch(self, batch: Batch, started_ns: int) -> None:
        now = now_ns()
        busy = self.n_processing  # counted before anyone is released, as on_decoded sees them
        for slot in batch.generating:
            if slot.task is None or slot.task.cancelled:
                continue  # cancelled while the batch ran: released at the next turn
            slot.cache.append(slot.pending_token)
            self._sample(slot, now)
        for slot, n in batch.prompt_chunks:
            if slot.task is None or slot.task.cancelled:
                continue
            prompt = slot.task.params.prompt_tokens
            slot.cache.extend(prompt[len(slot.cache):len(slot.cache) + n])
            slot.n_prompt_processed += n
            if len(slot.cache) == len(prompt):
                slot.state = SlotState.GENERATING
                slot.prompt_ms = (now - slot.t_prompt_start_ns) / NS_PER_MS
                slot.t_first_token_ns = now
                self._sample(slot, now)
        self.metrics.on_decode(busy, batch.n_prompt_tokens, (now - started_ns) / NS_PER_MS,
                               max(len(slot.cache) for slot in self.slots))

    def _sample(self, slot: Slot, now: int) -> None:
        """One generated token, then llama-server's stop checks in its order: stop word, context full,
        n_predict reached (only if nothing stopped it yet), EOS (overrides the others)."""
        task = slot.task
        assert task is not None and slot.source is not None
        params = task.params
        slot.n_decoded += 1
        if not params.ignore_eos and task.rng.random() < self.profile.eos_probability:
            token, piece = EOS_TOKEN, ""  # EOS is counted as a generated token but shows no text
        else:
            token, piece = slot.source.next_piece()
        slot.pending_token = token
        if params.return_tokens:
            slot.tokens.append(token)
        start = max(0, len(slot.text) - max((len(w) for w in params.stop), default=0))
        slot.text += piece
        slot.has_new_line |= "\n" in piece
        stop_type, stopping_word, truncated = "none", "", False
        word_at, word = _find_stop_word(slot.text, params.stop, start)
        if word_at >= 0:
            slot.text = slot.text[:word_at]
            stop_type, stopping_word = "word", word
        if len(slot.cache) + 1 >= slot.n_ctx:  # no room for the token just sampled
            stop_type, truncated = "limit", True
        if stop_type == "none" and 0 <= params.n_predict <= slot.n_decoded:  # n_predict 0 still samples one
            stop_type = "limit"
        if token == EOS_TOKEN:
            stop_type = "eos"
        if params.stream:
            # Hold back text that may be the start of a stop word, unless the request ends here.
            held = _partial_stop_len(slot.text, params.stop) if stop_type == "none" else 0
            text = slot.text[slot.n_sent:len(slot.text) - held]
            slot.n_sent += len(text)
            timings = self._timings(slot, now) if params.timings_per_token else None
            task.emit(TokenEvent(text, token, slot.n_decoded, slot.id, len(params.prompt_tokens), timings))
        if stop_type != "none":
            self._finish(slot, now, stop_type, stopping_word, truncated)

    def _timings(self, slot: Slot, now: int) -> Timings:
        return Timings(
            cache_n=slot.n_prompt_cached,
            prompt_n=slot.n_prompt_processed,
            prompt_ms=slot.prompt_ms,
            predicted_n=slot.n_decoded,
            predicted_ms=_predicted_ms(slot, now),
        )

    def _finish(self, slot: Slot, now: int, stop_type: str, stopping_word: str, truncated: bool) -> None:
        task = slot.task
        assert task is not None
        task.emit(FinalEvent(CompletionResult(
            content=slot.text,
            tokens=tuple(slot.tokens),
            id_slot=slot.id,
            n_decoded=slot.n_decoded,
            n_prompt_tokens=len(task.params.prompt_tokens),
            n_tokens_cached=len(slot.cache),
            stop_type=stop_type,
            stopping_word=stopping_word,
            truncated=truncated,
            has_new_line=slot.has_new_line,
            timings=self._timings(slot, now),
        )))
        self._release(slot, now)

    def _release(self, slot: Slot, now: int) -> None:
        self.metrics.on_release(slot.n_decoded, _predicted_ms(slot, now))
        slot.state, slot.task, slot.t_last_used_ns = SlotState.IDLE, None, now
        # A released slot loses its per-task stats; its KV cache stays for the next prompt.
        slot.n_prompt_cached = slot.n_prompt_processed = slot.n_decoded = 0
        slot.has_new_line = False
        self._wake.set()


def _predicted_ms(slot: Slot, now: int) -> float:
    """First token -> now; at least 1 us once generation started, as llama-server clamps it."""
    if not slot.t_first_token_ns:
        return 0.0
    return max(0.001, (now - slot.t_first_token_ns) / NS_PER_MS)


_common_prefix = common_prefix


def _find_stop_word(text: str, words: tuple[str, ...], start: int) -> tuple[int, str]:
    """The first complete stop word in text[start:] -> (position, word), or (-1, "")."""
    best, best_word = -1, ""
    for word in words:
        at = text.find(word, start)
        if at >= 0 and (best < 0 or at < best):
            best, best_word = at, word
    return best, best_word


def _partial_stop_len(text: str, words: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that a stop word starts with."""
    longest = 0
    for word in words:
        for n in range(min(len(word) - 1, len(text)), longest, -1):
            if text.endswith(word[:n]):
                longest = n
                break
    return longest


def _shutdown_error() -> ErrorEvent:
    return ErrorEvent(503, {"code": 503, "message": "the simulator is shutting down", "type": "unavailable_error"})
