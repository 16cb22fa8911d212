"""Pure functions over records and run documents: every derived metric, saturation verdicts,
compare's statistics, the gate's decision, and the prefill, depth and soak figures.

No I/O, no clock, no terminal. Imports core only.
"""
