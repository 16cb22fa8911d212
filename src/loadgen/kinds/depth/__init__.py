"""`loadgen depth`: decode speed after a context filled to each depth (command.py); the steps run
in run/steps.py, the figures in analysis/depth.py, its table is output/tables.py `depth_table`."""
