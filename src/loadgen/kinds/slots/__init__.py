"""`loadgen slots`: saved and restored slots (command.py); the cycles run in run/slots.py, the
verdicts in analysis/slots.py, its table is output/slots.py `slots_table`. docs/slots.md."""
