"""Does ``classify --dtype auto`` give the labels the same command gives with ``--dtype float32``, on every row, with
the default prior (the job's), in ascending and descending length order, resumed after a kill and on two processes?
The real command, as a user runs it: N varied tickets (``make_tickets(style="varied")``) and 6 few-shot examples in a
CSV, sorted by word count; each auto run's labels compared row by row with the float32 run of the same file. Where
bfloat16 is not fast (notebook 00's profile), auto resolves to float32 and says so: the check then proves nothing
about rounding, and the script says which it was.

Run: .venv/bin/python benchmarks/auto_agrees.py [MODEL] [N]   (default: embedded 672; about 12 minutes on 2 cores)
"""

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from helpers.data import few_shot_examples, make_tickets

ROOT = Path(__file__).parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29581"]


def classify(source: Path, output: Path, model: str, dtype: str, examples: Path, launcher=(sys.executable, "-m")):
    """One ``classify`` command; returns (seconds, its stderr). ``launcher`` may stop it (kill_after_batches.py)."""
    args = [str(source), "--labels", "billing,technical,account", "--examples", str(examples), "--model", model]
    command = [*launcher, "helpers", "classify", *args, "--output", str(output), "--dtype", dtype, "--quiet"]
    if launcher[-1] != "-m":  # a script taking classify's arguments
        command.remove("helpers")
    began = time.perf_counter()
    done = subprocess.run(command, env=ENV, capture_output=True, text=True)
    return time.perf_counter() - began, done


def said(stderr: str, start: str) -> str:
    return next((line for line in stderr.splitlines() if line.startswith(start)), f"(no line starting {start!r})")


def main(model: str, n: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="auto_agrees_"))
    examples = folder / "examples.csv"
    pd.DataFrame(few_shot_examples(6), columns=["text", "label"]).to_csv(examples, index=False)
    tickets = make_tickets(n, seed=7, style="varied")
    print(f"{model} · {n} varied tickets (make_tickets seed 7), 6 examples, default prior · in {folder}")
    print("| order | run | labels the float32 run's | seconds | resolved | prior | proven |")
    print("|---|---|---|---|---|---|---|")
    for order, ascending in (("ascending", True), ("descending", False)):
        source = folder / f"{order}.csv"
        tickets.sort_values("n_words", ascending=ascending, kind="stable")[["text"]].to_csv(source, index=False)
        seconds, reference = classify(source, folder / f"{order}.float32.csv", model, "float32", examples)
        assert reference.returncode == 0, reference.stderr[-2000:]
        expected = pd.read_csv(folder / f"{order}.float32.csv")["predicted_label"]
        print(f"| {order} | float32 | reference | {seconds:.0f} | | {said(reference.stderr, 'prior (')[:80]} | |")
        runs = {"auto": (sys.executable, "-m")}
        if ascending:
            stopper = (sys.executable, str(ROOT / "tests" / "kill_after_batches.py"), "20")
            runs.update({"auto, killed after 20 batches": stopper, "auto, resumed": (sys.executable, "-m")})
            runs["auto, two processes"] = (*TORCHRUN, "-m")
        for name, launcher in runs.items():
            kind = "two" if "two" in name else "resumed" if "killed" in name or "resumed" in name else "auto"
            output = folder / f"{order}.{kind}.csv"
            seconds, done = classify(source, output, model, "auto", examples, launcher)
            if "killed" in name:
                print(f"| {order} | {name} | (stopped: exit {done.returncode}) | {seconds:.0f} | | | |", flush=True)
                continue
            assert done.returncode == 0, done.stderr[-2000:]
            labels = pd.read_csv(output)["predicted_label"]
            same = int((labels == expected).sum())
            resolved = re.sub(r"^--dtype auto: ", "", said(done.stderr, "--dtype auto: "))[:60]
            if "resumed" in name:
                resolved = f"{said(done.stderr, 'resuming: ')[:40]}; {resolved}"
            proven = re.sub(r".*Every label is", "Every label is", said(done.stderr, "--dtype auto, the bound"))
            cells = [order, name, f"{same} of {n}", f"{seconds:.0f}", resolved, "", proven]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "embedded", int(args[1]) if len(args) > 1 else 672)
