"""`loadgen cache-capacity`: how many conversations the prompt cache keeps warm (command.py): K
conversations round-robin, K raised level by level, each K a run of its own under the folder, the
folder's answer in cache-capacity.json (analysis/cache.py). docs/cache.md."""
