"""Run ``python -m helpers classify`` from a working folder of each process's own (used by test_resume): under
torchrun, ``own_folder_per_rank.py BASE classify ARGS...`` runs rank R in BASE/rankR, so a relative ``--output`` names
a folder per process, as the same path does on machines that do not share a disk."""

import os
import sys
from pathlib import Path

from helpers.__main__ import main

base = Path(sys.argv.pop(1))
own = base / f"rank{os.environ.get('RANK', '0')}"
own.mkdir(parents=True, exist_ok=True)
os.chdir(own)
sys.exit(main(sys.argv[1:]))
