"""`loadgen replay`: a recorded trace's requests sent at their trace times (command.py), read back as
any `--rate` sweep is. Its load is run/trace_replay.py's plan over the one level runner."""
