"""`loadgen sim`: run a simulated llama-server in the foreground until SIGINT or SIGTERM.

The main CLI registers it with `cli.add_command(sim_command)`.
"""

from __future__ import annotations

import asyncio
import signal

import click

from .faults import FAULT_KINDS, FaultConfig
from .profile import builtin_profiles, load_profile


@click.command("sim")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--profile", "profile_name", default="moe-35b-a3b", show_default=True,
              help=f"Model profile: {', '.join(builtin_profiles())}, or a path to a .toml file.")
@click.option("--slots", type=click.IntRange(min=1), default=4, show_default=True, help="Parallel slots (-np).")
@click.option("--metrics/--no-metrics", default=True, show_default=True, help="Serve /metrics (else it answers 501).")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Multiply every model duration (0.05: 20x faster). Reported timings are the real, scaled times.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for generated text, EOS and faults.")
@click.option("--load-seconds", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Answer 503 'Loading model' on every endpoint for this long after start (scaled).")
@click.option("--fault", "fault_specs", multiple=True, metavar="KIND:SHARE",
              help="Inject a fault into that share of requests (repeatable; replaces the profile's faults): "
                   f"{', '.join(FAULT_KINDS)}. Timed ones: first_byte_stall:SECONDS[:SHARE], "
                   "slow_drip:SHARE[:SECONDS].")
@click.option("--threads-http", type=click.IntRange(min=1), default=None,
              help="A fixed pool of this many HTTP threads, each kept by a keep-alive connection until it "
                   "has been idle for --keep-alive-timeout (llama-server's HTTP library); default: no limit.")
@click.option("--keep-alive-timeout", "keep_alive_s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds an idle keep-alive connection keeps its HTTP thread (with --threads-http).")
@click.option("--cache-ram-tokens", type=click.IntRange(min=0), default=0, show_default=True,
              help="A host-memory prompt cache of this many tokens, as llama-server's --cache-ram keeps one "
                   "(slots' tokens saved, the best match restored and removed, oldest evicted first); 0: none.")
@click.option("--reasoning-tokens", type=click.IntRange(min=0), default=0, show_default=True,
              help="Reasoning mode: the first N tokens of every chat, Responses and Messages answer are thinking, "
                   "streamed as those APIs' reasoning deltas.")
@click.option("--embeddings", is_flag=True, help="Serve /v1/embeddings (llama-server's --embeddings; else a 501).")
@click.option("--reranking", is_flag=True, help="Serve /v1/rerank (llama-server's --reranking; else a 501).")
def sim_command(port: int, host: str, profile_name: str, slots: int, metrics: bool, time_scale: float, seed: int,
                load_seconds: float, fault_specs: tuple[str, ...], threads_http: int | None, keep_alive_s: float,
                cache_ram_tokens: int, reasoning_tokens: int, embeddings: bool = False, reranking: bool = False) -> None:
    """Run a simulated llama-server (same API, slots, batching and /metrics; no model needed)."""
    from ..run.loops import loop_factory
    from .server import start_simulator

    try:
        profile = load_profile(profile_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--profile") from None
    try:
        faults = FaultConfig.parse(fault_specs) if fault_specs else profile.faults
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--fault") from None

    async def serve() -> None:
        try:
            sim = await start_simulator(profile, host=host, port=port, slots=slots, metrics=metrics,
                                        time_scale=time_scale, seed=seed, load_seconds=load_seconds, faults=faults,
                                        threads_http=threads_http, keep_alive_s=keep_alive_s,
                                        cache_ram_tokens=cache_ram_tokens, reasoning_tokens=reasoning_tokens,
                                        embeddings=embeddings, reranking=reranking)
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        click.echo(f"loadgen sim: {profile.name} as '{profile.model_alias}' on {sim.url}, {slots} slots, "
                   f"time scale {time_scale:g}, metrics {'on' if metrics else 'off'}"
                   + (f", faults {', '.join(fault_specs)}" if fault_specs else "")
                   + (f", {threads_http} HTTP threads" if threads_http else "")
                   + " (Ctrl-C to stop)", err=True)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopping.set)
        try:
            await stopping.wait()
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            await sim.stop()
        click.echo("loadgen sim: stopped", err=True)

    factory, _ = loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve())
