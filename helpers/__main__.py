"""Command line: ``python -m helpers check`` (notebook 00), ``python -m helpers bench ...`` (notebook 04),
``python -m helpers classify ...`` and ``python -m helpers setup-cells`` (the notebooks' first cell)."""

from __future__ import annotations

import argparse
import sys


def _csv_list(kind):
    def parse(text: str):
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}"
            ) from None

    return parse


def add_bench_parser(commands) -> None:
    from .bench import POOL, STRATEGIES
    from .models import DEVICES

    bench = commands.add_parser("bench", help="notebook 04's sweep: the techniques against the float32 loop")
    bench.add_argument("--model", default=None, help="hub id, local path, 'embedded' or 'twin:qwen2.5-0.5b'")
    bench.add_argument("--n", type=int, default=POOL, help=f"tickets in the workload (default {POOL})")
    bench.add_argument(
        "--every",
        type=int,
        default=10,
        help="time every k-th block of the sorted tickets and scale (default 10; 1: time all)",
    )
    bench.add_argument("--shots", type=int, default=3, help="few-shot examples in the prompt (default 3)")
    bench.add_argument(
        "--strategies",
        type=_csv_list(str),
        default=list(STRATEGIES),
        help=f"comma-separated, from {', '.join(STRATEGIES)} (default: all)",
    )
    bench.add_argument(
        "--batch-sizes",
        type=_csv_list(int),
        default=[1, 2, 4, 8, 16, 32],
        help="comma-separated; each divides the largest (default 1,2,4,8,16,32)",
    )
    bench.add_argument(
        "--dtypes",
        type=_csv_list(str),
        default=["float32"],
        help="comma-separated; the first is the reference (default float32)",
    )
    bench.add_argument("--repeats", type=int, default=3, help="timed rounds, alternating (default 3)")
    bench.add_argument("--compile", action="store_true", help="torch.compile the model first (warm-up untimed)")
    bench.add_argument(
        "--device",
        default=None,
        choices=DEVICES,
        help="auto: CUDA, then Apple's MPS, then the CPU (default: $SLM_DEVICE, else auto)",
    )
    bench.add_argument("--csv", dest="csv_path", default=None, help="write the rows as CSV here")
    bench.add_argument("--quiet", action="store_true", help="no progress bars")


def run_bench(args) -> int:
    from .bench import run_benchmark

    frame = run_benchmark(
        args.model,
        shots=args.shots,
        strategies=args.strategies,
        batch_sizes=args.batch_sizes,
        dtypes=args.dtypes,
        every=args.every,
        repeats=args.repeats,
        n=args.n,
        device=args.device,
        compile=args.compile,
        progress=not args.quiet,
    )
    first = frame.iloc[0]
    print(
        f"{first.model} · {first.device} · {first.threads} threads · {first.machine} · {first.shots} shots "
        f"(prefix {first.prefix_tokens} tokens) · {first.repeats} repeats"
        + (" · random weights: timing only" if first.timing_only else "")
    )
    picked = "every block" if args.every == 1 else f"every {args.every}-th block"
    print(
        f"each row: {first.timed.split(',')[0]} ({picked} of the sorted tickets), seconds scaled by the plan's "
        f"padded tokens over the sample's; agreement: against the {args.dtypes[0]} loop"
    )
    columns = [
        "strategy",
        "batch_size",
        "dtype",
        "items_per_s",
        "items_per_s_min",
        "items_per_s_max",
        "speedup_vs_loop",
        "padding_fraction",
        "plan_padding",
        "scale",
        "agreement",
        "max_abs_diff",
    ]
    print(frame[[c for c in columns if c in frame]].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for line in frame.attrs["failed"]:
        print(f"not measured: {line}")
    if args.csv_path:
        frame.to_csv(args.csv_path, index=False)
    return 0


def add_classify_parser(commands) -> None:
    from .models import DEVICES

    classify = commands.add_parser("classify", help="classify the texts of a CSV or JSONL file")
    classify.add_argument("input", help="a .csv or .jsonl file")
    classify.add_argument("--labels", required=True, help="comma-separated, e.g. billing,technical,account")
    classify.add_argument("--output", required=True, help="where to write the result (.csv or .jsonl)")
    classify.add_argument("--text-column", default="text", help="the column holding the texts (default: text)")
    classify.add_argument("--model", default=None, help="hub id, local path or 'embedded' (default: as load_model)")
    classify.add_argument(
        "--dtype",
        default=None,
        help="float32, bfloat16, float16 (default: float32 on CPU and MPS; on CUDA "
        "bfloat16 from compute capability 8.0, float16 below it where a probe forward gives finite logits, "
        "else float32)",
    )
    classify.add_argument(
        "--device",
        default=None,
        choices=DEVICES,
        help="auto: CUDA, then Apple's MPS, then the CPU (default: $SLM_DEVICE, else auto)",
    )
    classify.add_argument(
        "--strategy",
        default="sorted",
        choices=["loop", "arbitrary", "sorted", "token_budget"],
        help="batching: sorted (default), loop, arbitrary or token_budget",
    )
    classify.add_argument("--batch-size", type=int, default=8, help="rows per batch (default 8)")
    classify.add_argument(
        "--token-budget", type=int, default=None, help="padded tokens per batch; implies --strategy token_budget"
    )
    classify.add_argument("--no-prefix-cache", action="store_true", help="run every prompt in full")
    classify.add_argument(
        "--whole-answers",
        action="store_true",
        default=None,
        help="score each label followed by the end-of-answer marker (default: only when a label's "
        "tokens start another's, e.g. account / account change, where it is needed)",
    )
    classify.add_argument(
        "--examples", default=None, help="few-shot examples: a .csv/.jsonl with text and label columns"
    )
    classify.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="K",
        help="re-run K random rows one at a time and fail on any disagreement",
    )
    classify.add_argument("--truncate", action="store_true", help="cut texts longer than the context (keeps the head)")
    classify.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    classify.add_argument("--quiet", action="store_true", help="no progress bar")


def run_classify(args) -> int:
    from .classify import classify_file

    classify_file(
        args.input,
        args.labels,
        args.output,
        text_column=args.text_column,
        model_name=args.model,
        dtype=args.dtype,
        strategy=args.strategy,
        batch_size=args.batch_size,
        token_budget=args.token_budget,
        prefix_cache=not args.no_prefix_cache,
        whole_answers=args.whole_answers,
        examples_path=args.examples,
        verify=args.verify,
        truncate=args.truncate,
        overwrite=args.overwrite,
        progress=not args.quiet,
        device=args.device,
    )
    _close_processes()
    return 0


def _close_processes() -> None:
    """End a data-parallel run's process group on every process. Left to interpreter shutdown, the gloo group's
    threads can abort a process that has finished its work ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_check(args) -> int:
    """Versions, device, and every requirement with its fix; exit status 1 on a hard problem."""
    from .environment import EnvironmentProblem, check_environment

    try:
        print(check_environment(commands=True))
    except EnvironmentProblem as problem:
        print(problem.report)
        print(problem, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="check this environment: versions, device, the embedded model, a Jupyter kernel")
    add_bench_parser(commands)
    add_classify_parser(commands)
    from . import bootstrap

    bootstrap.add_parser(commands)
    args = parser.parse_args(argv)
    try:
        return {"check": run_check, "bench": run_bench, "classify": run_classify, "setup-cells": bootstrap.run}[
            args.command
        ](args)
    except (ValueError, RuntimeError, OSError) as error:
        print(f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
        _settle_processes(error)
        return 2


def _settle_processes(error: BaseException) -> None:
    """After a failure every process of a data-parallel run knows of, wait until all have said it.

    Otherwise the launcher, seeing the first process exit, could stop the others before they print.
    """
    from .classify import ProcessFailure

    if isinstance(error, ProcessFailure):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()


if __name__ == "__main__":
    sys.exit(main())
