"""Run ``python -m helpers classify`` with another ``SLM_MODEL`` on each process (used by test_resume): under torchrun,
``model_per_rank.py NAME0,NAME1 classify ARGS...`` gives rank R the R-th name, as machines whose caches hold other
models resolve the default to other models."""

import os
import sys

from helpers.__main__ import main

os.environ["SLM_MODEL"] = sys.argv.pop(1).split(",")[int(os.environ.get("RANK", "0"))]
sys.exit(main(sys.argv[1:]))
