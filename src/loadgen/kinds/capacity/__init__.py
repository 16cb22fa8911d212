"""`loadgen capacity`: the most users (or req/s) a server serves within latency targets (command.py),
a level plan (run/capacity.py) over the one level runner whose levels the search
(analysis/capacity_search.py) picks; its answer is said after its tables (view.py)."""
