"""Run ``python -m helpers classify`` with scoring failing on one process only (used by test_classify).

Usage under torchrun: ``fail_on_one_rank.py RANK classify ARGS...``. The failing process raises in the middle
of its share, as a real fault (out of memory, a bad row) would; the others must not wait for it forever.
"""

import os
import sys

import helpers.classify as classify
from helpers.__main__ import main

failing_rank = int(sys.argv.pop(1))
real_run_plan = classify.run_plan


def run_plan(*args, **kwargs):
    if int(os.environ.get("RANK", "0")) == failing_rank:
        raise RuntimeError(f"injected failure on rank {failing_rank}")
    return real_run_plan(*args, **kwargs)


classify.run_plan = run_plan
sys.exit(main(sys.argv[1:]))
