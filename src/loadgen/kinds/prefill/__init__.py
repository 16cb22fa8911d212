"""`loadgen prefill`: prefill speed per prompt length (command.py); the steps run in run/steps.py,
the figures in analysis/prefill.py, its table is output/tables.py `prefill_table` (its view)."""
