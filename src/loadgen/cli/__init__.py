"""The command line: every command in one place (main.py names them), each thin: parse, validate, call.

sweep.py (sweep, demo), analyze.py, modes.py (prefill, depth, soak), run.py (scenario files),
gate.py (compare, gate), report.py (export, report); shared.py and options.py hold what they
share, execute.py runs a measuring command's event loop, signals and final write.
"""

from .main import cli, main

__all__ = ["cli", "main"]
