"""Every step of a ``classify`` run that crosses processes, in one place: under ``torchrun`` or ``accelerate launch``
one process per GPU (or CPU processes talking through gloo) each score a share of the rows and rank 0 writes; as one
process, each step is a plain call (docs/classify.md, "More than one process")."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .tables import InputError, one_line


class ProcessFailure(RuntimeError):
    """A failure every process of a data-parallel run has learned of; each stops with its message."""


class Processes:
    """Every step that crosses processes, in one place (one process: each is a plain call). ``step`` runs work on
    every process and then tells each whether any failed: a process failing alone would leave the others waiting in
    the next collective; each stops with the lowest failing rank's message. One process per GPU under a launcher; CPU
    processes talk through gloo."""

    def __init__(self, device: str | None):
        from accelerate import PartialState

        from .models import pick_device

        try:
            wanted = pick_device(device)
        except RuntimeError as error:  # an unavailable device, said before anything loads
            raise InputError(str(error)) from None
        self.state = PartialState(cpu=wanted.type == "cpu")
        self.count = self.state.num_processes
        self.rank = self.state.process_index
        self.main = self.state.is_main_process
        if self.count > 1 and wanted.type == "mps":
            raise InputError(
                "several processes on one Apple GPU do not pay: run classify as one process with --device mps"
            )
        self.device = self.state.device if self.count > 1 else wanted

    def step(self, work: Callable[[], Any]) -> Any:
        try:
            result, error = work(), None
        except Exception as caught:  # reported to every process below, then raised
            result, error = None, caught
        if self.count > 1:
            reports = self.gather([(self.rank, None if error is None else one_line(error))])
            failed = [(rank, message) for rank, message in reports if message is not None]
            if failed:
                raise ProcessFailure(f"process {failed[0][0]} of {self.count}: {failed[0][1]}") from error
        if error is not None:
            raise error
        return result

    def gather(self, items: list) -> list:
        """Every process's ``items``, in rank order, on every process."""
        from accelerate.utils import gather_object

        return gather_object(items) if self.count > 1 else list(items)

    def decide(self, work: Callable[[], Any]) -> Any:
        """``work``'s result on rank 0, the same on every process (the others do not run it)."""
        return self.gather([self.step(lambda: work() if self.main else None)])[0]

    def check_shared(self, folder: Path, name: str) -> None:
        """Every process writes a mark in ``folder`` (named after ``name``, with a token of this run) and checks it
        sees every other process's: the progress files and the output live there, and processes on machines that do
        not share it would each resume from their own disk's files and fail after a whole scoring pass. A folder not
        shared is one line on every process, before any row is scored. One process: nothing to check."""
        if self.count == 1:
            return
        token = self.decide(lambda: secrets.token_hex(8))
        marks = [folder / f".{name}.process.{rank}" for rank in range(self.count)]
        self.step(lambda: marks[self.rank].write_text(token, encoding="utf-8"))

        def check():
            seen = sum(mark.is_file() and mark.read_text(encoding="utf-8") == token for mark in marks)
            if seen < self.count:
                why = f"process {self.rank} sees the marks of {seen} of the run's {self.count} processes there"
                fix = "give --output a path in a folder every machine sees (the progress files are kept beside it)"
                raise InputError(f"{folder}: the output's folder is not shared by the run's processes ({why}): {fix}")

        try:
            self.step(check)
        finally:
            self.step(lambda: marks[self.rank].unlink(missing_ok=True))

    def share(self, rows: list[int]) -> list[int]:
        """This process's share of ``rows`` (contiguous, the first processes one more where they do not divide)."""
        with self.state.split_between_processes(rows) as mine:
            return list(mine)
