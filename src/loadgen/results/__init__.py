"""The results directory, the contract between a run and everything that reads it.

schema.py (what run.json holds, versioned), reader.py (load and check; imports only core and the
schema, so reading a run needs neither the engine nor an HTTP client), writer.py (build run.json
from a run and write the files atomically). The reader's functions are here too.
"""

from .reader import load_probe, load_records, load_run

__all__ = ["load_probe", "load_records", "load_run"]
