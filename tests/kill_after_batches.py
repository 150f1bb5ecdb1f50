"""Run ``python -m helpers classify`` and SIGKILL this process once K batches have landed in its progress file
(used by test_resume). Usage: ``kill_after_batches.py K classify ARGS...``; under torchrun, rank 0 is killed."""

import os
import signal
import sys

from helpers import resume
from helpers.__main__ import main

after = int(sys.argv.pop(1))
real_append = resume.ProgressWriter.append
landed = []


def append(self, rows, log_scores, full, exact):
    real_append(self, rows, log_scores, full, exact)
    landed.append(len(rows))
    if len(landed) >= after and os.environ.get("RANK", "0") == "0":
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would: no cleanup, no atexit


resume.ProgressWriter.append = append
sys.exit(main(sys.argv[1:]))
