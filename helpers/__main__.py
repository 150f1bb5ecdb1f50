"""Command line: ``python -m helpers bench ...`` (notebook 04)."""

from __future__ import annotations

import argparse
import json
import sys


def _csv_list(kind):
    def parse(text: str):
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}") from None

    return parse


def add_bench_parser(commands) -> None:
    from .bench import DEFAULT_BATCH_SIZES, DEFAULT_DTYPES, DEFAULT_STRATEGIES, EXTRA_STRATEGIES, STRATEGIES

    bench = commands.add_parser("bench", help="benchmark the techniques against the float32 loop")
    bench.add_argument("--model", default=None, help="hub id, local path, 'embedded' or 'twin:qwen2.5-0.5b' (default: as load_model)")
    bench.add_argument("--n", type=int, default=32, help="tickets (default 32; the reference uses 600)")
    bench.add_argument("--style", default="article", choices=["article", "varied"])
    bench.add_argument("--shots", type=int, default=6, help="few-shot examples in the prompt (default 6)")
    bench.add_argument("--strategies", type=_csv_list(str), default=list(DEFAULT_STRATEGIES),
                       help=f"comma-separated, from {','.join((*STRATEGIES, *EXTRA_STRATEGIES))}")
    bench.add_argument("--batch-sizes", type=_csv_list(int), default=list(DEFAULT_BATCH_SIZES), help="e.g. 1,2,4,8,16,32,64")
    bench.add_argument("--dtypes", type=_csv_list(str), default=list(DEFAULT_DTYPES), help="e.g. float32,bfloat16")
    bench.add_argument("--repeats", type=int, default=1, help="timed runs per row; the median is reported")
    bench.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    bench.add_argument("--json", dest="json_path", default=None, help="write the rows as a JSON list here")
    bench.add_argument("--csv", dest="csv_path", default=None, help="write the rows as CSV here")
    bench.add_argument("--quiet", action="store_true", help="no progress bars")


def run_bench(args) -> int:
    from .bench import run_benchmark

    frame = run_benchmark(
        args.model, n=args.n, style=args.style, shots=args.shots, strategies=args.strategies,
        batch_sizes=args.batch_sizes, dtypes=args.dtypes, repeats=args.repeats, device=args.device,
        progress=not args.quiet,
    )
    columns = ["strategy", "batch_size", "dtype", "items_per_s", "speedup_vs_loop", "padding_fraction",
               "agreement", "max_abs_diff", "roof_fraction", "peak_memory_mb"]
    first = frame.iloc[0]
    print(f"{first.model} · {first.device} · {first.threads} threads · n={first.n} · {first.shots} shots "
          f"(prefix {first.prefix_tokens} tokens)" + (" · random weights: timing only" if first.timing_only else ""))
    print(frame[[c for c in columns if c in frame]].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(json.loads(frame.to_json(orient="records")), handle, indent=1)
    if args.csv_path:
        frame.to_csv(args.csv_path, index=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(commands)
    args = parser.parse_args(argv)
    try:
        return {"bench": run_bench}[args.command](args)
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
