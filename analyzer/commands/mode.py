"""MA's global `-m/--mode online|offline`, given before the command (`model-analyzer -m offline
profile ...`): the summary's preset plots. Online (the default) ranks by latency under load:
throughput vs p99 latency; offline adds throughput vs client batch size, what a batch job
tunes."""

from __future__ import annotations

MODES = ("online", "offline")
mode = "online"  # set by the app's callback before any command runs
