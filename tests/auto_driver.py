"""Run ``python -m helpers classify --dtype auto`` with each process's machine profile made up (used by test_resume):
bfloat16's matmul at SPEEDS[rank] times float32's, so processes that resolved ``auto`` alone would disagree; with
$KILL_AFTER=K, rank 0 is SIGKILLed once K batches have landed. The job's prior comes from 8 rows (``PRIOR_ROWS``), so
that the test's small jobs leave rows to the half pass. Usage: ``auto_driver.py SPEEDS classify ARGS...``
(SPEEDS: e.g. ``8.0,0.02``)."""

import os
import signal
import sys

import helpers.classify as classify
from helpers import resume
from helpers.__main__ import main
from tests.test_profile import synthetic

rank = int(os.environ.get("RANK", "0"))
speeds = [float(speed) for speed in sys.argv.pop(1).split(",")]
classify.machine_profile = lambda model, info, **options: synthetic(bf16=120.0 * speeds[rank], fp32=120.0)
classify.PRIOR_ROWS = 8
real_append, landed = resume.ProgressWriter.append, []


def append(self, rows, log_scores, full, exact):
    real_append(self, rows, log_scores, full, exact)
    landed.append(len(rows))
    if len(landed) >= int(os.environ.get("KILL_AFTER") or 10**9) and rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would: no cleanup, no atexit


resume.ProgressWriter.append = append
sys.exit(main(sys.argv[1:]))
