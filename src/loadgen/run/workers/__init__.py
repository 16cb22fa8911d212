"""Scale-out: a level's requests shared over worker processes (`--workers`) or Ray actors (`--ray`).

parent.py (the pool and its handles: start, share, gather), child.py (a worker's entry point),
protocol.py (what they say to each other), ray_actors.py (the same workers as Ray actors),
ray_address.py (where the Ray cluster is, checked before Ray is imported), merge.py (the arithmetic:
shares, schedules, records and histograms merged).
"""
