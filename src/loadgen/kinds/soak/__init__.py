"""`loadgen soak`: steady load for hours (command.py), run by run/soak.py, its figures in
analysis/soak.py, its table output/tables.py `soak_table`."""
