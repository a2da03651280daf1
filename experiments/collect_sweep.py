"""Collect a sweep directory into sweep.csv, sweep.md and plots (same as ``python -m dlmsearch.sweeps.collect``).

python experiments/collect_sweep.py multirun/ablate_gate/<time> [--baseline "ablate.arm=fixed_d1 decoder.candidates.k=4"]
"""

import sys

from dlmsearch.sweeps.collect import main

if __name__ == "__main__":
    sys.exit(main())
