"""`loadgen chat`: multi-turn conversations that re-send their real history (command.py), run by
run/multiturn.py on the one client; per-turn tables in output/cache.py. docs/cache.md."""
