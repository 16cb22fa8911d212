"""The one clock every timestamp in loadgen is read from.

`time.monotonic_ns` is the clock asyncio's event loop uses (`loop.time()` is `time.monotonic()`),
so a send time taken here and a deadline handed to the loop are on the same axis. All recorded
times are integer nanoseconds on this clock; they mean nothing across processes or reboots, so a
run stores its own `start_ns` next to the wall-clock start time.
"""

import time

now_ns = time.monotonic_ns

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

