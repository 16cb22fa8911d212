"""A stand-in llama-server for `loadgen grid` tests: the simulator behind llama-server's flags and boot log.

    python tests/fake-llama-server.py --host H --port P -lv 4 [--parallel N] [-c N] [--die-after N] [--load-forever]
                                [--reuse-port] [--bind-after FILE] [--profile NAME|FILE] [--time-scale X]
                                [-fa on|off|auto] [--set-link SYSFS:GEN] [--link-drop N] [--cache-ram MIB]

It prints the boot-log lines loadgen reads (as llama-server does at -lv 4), refuses an unknown
flag as llama-server does (exit 1), can exit with code 3 after N completion requests (a server that
dies mid-sweep) or never finish loading (/health 503 forever). It binds with SO_REUSEPORT when
asked (as llama-server's HTTP library does), waits for FILE to exist before it binds (a test
takes its port meanwhile), and exits 1 with llama-server's line when it cannot bind. `--set-link`
sets the GPU link of a built sysfs tree (tests/machine_tree.py) to PCIe generation GEN x16 as it
boots (the machine of a cell); `--link-drop N` lowers it a generation once N completion requests
came (a change during one of its levels). `--cache-ram MIB` gives the simulator a host prompt cache
of MIB × 2²⁰ / 23,040 tokens (the boot log's 22.5 KiB of KV per cell).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from loadgen.sim import load_profile, start_simulator
from machine_tree import set_link

BYTES_PER_TOKEN = 23_040  # the boot log's KV per cell below (22.5 KiB: SmolLM2-135M's K+V per token)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # llama-server's way: one line, exit 1
        print(f"error: invalid argument: {message}", file=sys.stderr, flush=True)
        sys.exit(1)


def parse(argv: list[str]) -> argparse.Namespace:
    p = Parser(add_help=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("-lv", type=int, default=3)
    p.add_argument("--parallel", "-np", type=int, default=2)
    p.add_argument("-c", type=int, default=None)  # given: each slot's context is c // parallel, as llama-server's
    p.add_argument("-m", "--model")  # read by loadgen (grid's KV estimate and --memory), not by the stand-in
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--load-forever", action="store_true")
    p.add_argument("--reuse-port", action="store_true")
    p.add_argument("--bind-after", default=None)
    p.add_argument("--profile", default="smoke")  # the simulator's profile (a built-in name or a .toml file)
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--set-link", default=None)
    p.add_argument("--link-drop", type=int, default=0)
    p.add_argument("--flash-attn", "-fa", choices=("on", "off", "auto"), default="auto")
    p.add_argument("--cache-ram", "-cram", type=float, default=0)  # MiB, as llama-server's
    p.add_argument("--metal-working-set", type=float, default=None)  # MB: boot as a Metal build (a Mac) would
    return p.parse_args(argv)


def boot_log(args: argparse.Namespace) -> None:
    args.c = args.c or 2048
    per_slot = args.c // args.parallel
    if args.metal_working_set is not None:  # at any verbosity, as ggml-metal-device.m (build 11434) prints them
        print("ggml_metal_device_init: GPU name:   MTL0\n"
              "ggml_metal_device_init: GPU family: MTLGPUFamilyApple7  (1007)\n"
              "ggml_metal_device_init: has unified memory    = true\n"
              f"ggml_metal_device_init: recommendedMaxWorkingSetSize  = {args.metal_working_set:8.2f} MB\n"
              "llama_model_load_from_file_impl: using device MTL0 (Apple M1 Max) (unknown id) - 53083 MiB free")
    if args.lv >= 4:
        print(f"llama_context: n_seq_max     = {args.parallel}\nllama_context: n_ctx         = {args.c}\n"
              f"llama_context: n_ctx_seq     = {per_slot}\nllama_context: kv_unified    = false\n"
              f"llama_kv_cache: size = {args.c * BYTES_PER_TOKEN / 2**20:7.2f} MiB ({per_slot:6d} cells,  30 layers, "
              f"{args.parallel:2d}/{args.parallel} seqs), K (f16): 0.00 MiB, V (f16): 0.00 MiB")
        print(f"llama_context: flash_attn    = {args.flash_attn}")
        if args.flash_attn == "auto":  # as a later build resolves it
            print("sched_reserve: Flash Attention was auto, set to enabled")
    print(f"srv    load_model: initializing, n_slots = {args.parallel}, n_ctx_slot = {per_slot}, kv_unified = 'false'",
          flush=True)


def drop_link_at(server, set_link_arg: str, n: int) -> None:
    """Lower the tree's link a generation as the n-th completion request arrives, before it is answered
    (so the level that request belongs to is the one whose machine changed)."""
    sysfs, gen = set_link_arg.rsplit(":", 1)
    serve = server.completion

    async def completion(request, api):
        if server._n_requests + 1 == n:
            set_link(Path(sysfs), int(gen) - 1, 16)
        return await serve(request, api)

    server.completion = completion


async def serve(args: argparse.Namespace) -> None:
    if args.set_link:
        sysfs, gen = args.set_link.rsplit(":", 1)
        set_link(Path(sysfs), int(gen), 16)
    if args.bind_after:
        print(f"waiting for {args.bind_after} before binding", flush=True)
        while not os.path.exists(args.bind_after):
            await asyncio.sleep(0.02)
    try:
        profile = load_profile(args.profile)
        if args.c_given:  # a prompt and its answer longer than a slot's share of -c fail, as llama-server's
            profile = dataclasses.replace(profile, n_ctx=args.c // args.parallel)
        sim = await start_simulator(profile, host=args.host, port=args.port,
                                    slots=args.parallel, time_scale=args.time_scale, seed=args.seed,
                                    load_seconds=1e9 if args.load_forever else 0,
                                    reuse_port=args.reuse_port,
                                    cache_ram_tokens=int(args.cache_ram * 2**20 // BYTES_PER_TOKEN))
    except OSError:
        print(f"couldn't bind HTTP server socket, hostname: {args.host}, port: {args.port}", flush=True)
        sys.exit(1)
    print(f"main: server is listening on http://{args.host}:{args.port}", flush=True)
    if args.set_link and args.link_drop:
        drop_link_at(sim.server, args.set_link, args.link_drop)
    seen = 0
    while True:
        await asyncio.sleep(0.01)
        if sim.server._n_requests > seen:  # a line per request, as llama-server logs them
            seen = sim.server._n_requests
            print(f"completion request {seen}", flush=True)
        if args.die_after and sim.server._n_requests >= args.die_after:
            print("GGML_ASSERT: simulated crash", flush=True)
            os._exit(3)


def main() -> None:
    args = parse(sys.argv[1:])
    args.c_given = args.c is not None
    boot_log(args)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
