"""Running load: config, prompts, schedules and salts, the engine, the run model, one per-target
setup, and the kinds of run (sweep, prefill/depth steps, soak). Imports core, client and analysis.
"""
