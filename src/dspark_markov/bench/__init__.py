"""Benchmark harness and the ``dspark-markov bench`` command.

- :mod:`.harness`: CUDA-graph replay timing with a cold L2, eager host cost, median/spread of rounds;
- :mod:`.roofline`: the minimal-bytes model and the measured copy/read bandwidth;
- :mod:`.grid`: inputs, one runner per design, the round-robin over designs;
- :mod:`.report`: tables (text, markdown), JSON, CSV, PNG and the issue-5 targets;
- :mod:`.cli`: ``main(argv) -> int``.

Importing this package needs only torch; tqdm and matplotlib are imported when a run needs them.
"""

from .harness import Summary, summarize
from .roofline import Bandwidth, bandwidth_fraction, floor_us, minimal_bytes

__all__ = ["Bandwidth", "Summary", "bandwidth_fraction", "floor_us", "minimal_bytes", "summarize"]
