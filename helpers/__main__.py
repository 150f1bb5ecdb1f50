"""Command line: ``python -m helpers check`` (notebook 00), ``python -m helpers bench ...`` (notebook 04),
and ``python -m helpers classify ...`` (your own files)."""

import argparse
import sys

COLUMNS = "strategy batch_size dtype items_per_s items_per_s_min items_per_s_max speedup_vs_loop padding_fraction"
COLUMNS += " plan_padding agreement max_abs_diff"
# The parsers' choices and defaults, written here so that check and every --help run without torch or pandas; a test
# ties each to its module's own (models.DEVICES, batching.STRATEGIES, bench.Design, classify's, prior.PRIORS,
# engine.ENGINES and SPOT_EVERY).
DEVICES, PRIORS = ("auto", "cpu", "cuda", "mps"), ("none", "content-free", "job", "labelled")
BATCHING, ENGINES = ("loop", "arbitrary", "sorted", "token_budget"), ("vllm",)
SPOT_EVERY = 500
BENCH_STRATEGIES = ("loop", "loop_prefix", "sorted", "sorted_prefix")
POOL = 600
BATCH_SIZE = 16
PRIOR = "job"
JOB_PRIOR_MIN_ROWS = 10
PRIOR_ROWS = 128


def _csv_list(kind):
    def parse(text: str):
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            wanted = f"a comma-separated list of {kind.__name__}"
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None

    return parse


def _add_common(parser, run, model_help: str, quiet_help: str) -> None:
    parser.set_defaults(run=run)
    parser.add_argument("--model", dest="model_name", metavar="MODEL", default=None, help=model_help)
    auto = "auto: CUDA, then Apple's MPS, then the CPU (default: $SLM_DEVICE, else auto)"
    parser.add_argument("--device", default=None, choices=DEVICES, help=auto)
    parser.add_argument("--quiet", dest="progress", action="store_false", help=quiet_help)


def _keywords(args) -> dict:
    """The parsed options as keywords: each dest is its name in ``Design``, ``run_benchmark`` or ``classify_file``."""
    return {key: value for key, value in vars(args).items() if key not in ("command", "run", "csv_path")}


def add_bench_parser(commands) -> None:
    bench = commands.add_parser("bench", help="notebook 04's sweep: the techniques against the float32 loop")
    _add_common(bench, run_bench, "hub id, local path, 'embedded' or 'twin:qwen2.5-0.5b'", "no progress bars")
    add = bench.add_argument
    add("--n", type=int, default=POOL, help=f"tickets in the workload (default {POOL})")
    every = "time every k-th block of the sorted tickets and scale (default 10; 1: time all)"
    add("--every", type=int, default=10, help=every)
    add("--shots", type=int, default=3, help="few-shot examples in the prompt (default 3)")
    strategies = f"comma-separated, from {', '.join(BENCH_STRATEGIES)} (default: all)"
    add("--strategies", type=_csv_list(str), default=list(BENCH_STRATEGIES), help=strategies)
    sizes = "comma-separated; each divides the largest (default 1,2,4,8,16,32)"
    add("--batch-sizes", type=_csv_list(int), default=[1, 2, 4, 8, 16, 32], help=sizes)
    dtypes = "comma-separated; the first is the reference (default float32)"
    add("--dtypes", type=_csv_list(str), default=["float32"], help=dtypes)
    add("--repeats", type=int, default=3, help="timed rounds, alternating (default 3)")
    add("--compile", action="store_true", help="torch.compile the model first (warm-up untimed)")
    add("--csv", dest="csv_path", default=None, help="write the rows as CSV here")


def run_bench(args) -> int:
    from .bench import Design, run_benchmark

    options = _keywords(args)
    frame, _ = run_benchmark(design=Design(**{name: options.pop(name) for name in vars(Design())}), **options)
    first = frame.iloc[0]
    shots = f"{first.shots} shots (prefix {first.prefix_tokens} tokens) · {first.repeats} repeats"
    random = " · random weights: timing only" if first.timing_only else ""
    print(f"{first.model} · {first.device} · {first.threads} threads · {first.machine} · {shots}{random}")
    picked = "every block" if args.every == 1 else f"the block most like its stratum of every {args.every}"
    scaled = "each block's seconds scaled by its stratum's padded tokens over its own"
    agreement = f"agreement: against the {args.dtypes[0]} loop"
    print(f"each row: {first.timed.split(',')[0]} ({picked} of the sorted tickets), {scaled}; {agreement}")
    print(frame[[c for c in COLUMNS.split() if c in frame]].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for line in frame.attrs["failed"]:
        print(f"not measured: {line}")
    if args.csv_path:
        frame.to_csv(args.csv_path, index=False)
    return 0


def add_classify_parser(commands) -> None:
    classify = commands.add_parser("classify", help="classify the texts of a CSV or JSONL file")
    _add_common(classify, run_classify, "hub id, local path or 'embedded' (default: as load_model)", "no progress bar")
    add = classify.add_argument
    add("input_path", metavar="input", help="a .csv or .jsonl file")
    add("--labels", required=True, help="comma-separated, e.g. billing,technical,account")
    output = "where to write the result (.csv or .jsonl)"
    add("--output", dest="output_path", metavar="OUTPUT", required=True, help=output)
    add("--text-column", default="text", help="the column holding the texts (default: text)")
    dtype = "float32, bfloat16, float16, or auto: half precision verified (near ties rescored in float32, every label "
    dtype += "float32's) where the machine profile finds it fast, else float32 (default: float32 on CPU and MPS; on "
    dtype += "CUDA bfloat16 from compute capability 8.0, float16 below it where a probe forward gives finite logits)"
    add("--dtype", default=None, help=dtype)
    strategy = "batching: sorted (default), loop, arbitrary or token_budget"
    add("--strategy", default="sorted", choices=BATCHING, help=strategy)
    add("--batch-size", type=int, default=BATCH_SIZE, help=f"rows per batch (default {BATCH_SIZE})")
    add("--token-budget", type=int, default=None, help="padded tokens per batch; implies --strategy token_budget")
    add("--no-prefix-cache", dest="prefix_cache", action="store_false", help="run every prompt in full")
    whole = "score each label followed by the end-of-answer marker (default: only when a label's tokens start "
    whole += "another's, e.g. account / account change, where it is needed)"
    add("--whole-answers", action="store_true", default=None, help=whole)
    examples = "few-shot examples: a .csv/.jsonl with text and label columns"
    add("--examples", dest="examples_path", metavar="EXAMPLES", default=None, help=examples)
    verify = "re-run K random rows one at a time and fail on any disagreement"
    add("--verify", type=int, default=0, metavar="K", help=verify)
    prior = "the label prior divided out of every row's probabilities: the job's own mean (of "
    prior += f"{PRIOR_ROWS} rows spread over its lengths, scored first: in float32 under --dtype auto), "
    prior += "content-free inputs scored through the prompt, fitted to the file's own 'label' column (labelled: a "
    prior += f"sample of your queue, to save), or none (default: {PRIOR} from {JOB_PRIOR_MIN_ROWS} rows, content-free "
    prior += "below, none under a fitted head; docs/classify.md)"
    add("--prior", default=None, choices=PRIORS, help=prior)
    prior_from = "divide out a prior an earlier run saved (--save-prior): a row's label no longer depends on the rest "
    add("--prior-from", default=None, metavar="FILE", help=prior_from + "of its file")
    add("--save-prior", default=None, metavar="FILE", help="save the prior this run divides out, as JSON")
    add("--label-column", default="label", help="--prior labelled: the column of each row's true label (default label)")
    add("--truncate", action="store_true", help="cut texts longer than the context (keeps the head)")
    add("--overwrite", action="store_true", help="replace an existing output file")
    add("--restart", action="store_true", help="start afresh: remove the progress a stopped run of this job left")
    fit = "fit a label head (the labels' LM-head rows and a bias) on a .csv/.jsonl of labelled rows (text, label) in "
    add("--fit-head", default=None, metavar="LABELLED", help=fit + "this job's prompt, and score every row with it")
    add("--save-head", default=None, metavar="FILE", help="save the head --fit-head fitted, as JSON")
    add("--head-from", default=None, metavar="FILE", help="score every row with a head an earlier run saved")
    engine = f"score the rows in a serving engine ({', '.join(ENGINES)}), from its own environment (make engine), "
    engine += "after a golden set of the job's rows gives the package's float32 labels (docs/scale.md)"
    add("--engine", default=None, metavar="ENGINE", help=engine)
    spot = "with --engine: score every N-th of the engine's rows again in the package, in float32, and stop at any "
    spot += f"disagreement (default {SPOT_EVERY}; 0: off)"
    add("--spot-check", type=int, default=SPOT_EVERY, metavar="N", help=spot)
    golden = "with --engine: save the golden set it passed (rows, token ids, the package's float32 scores), for each "
    golden += "worker of a cluster job to check its own engine against at start (docs/scale.md)"
    add("--save-golden", default=None, metavar="FILE", help=golden)


def _process_group():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def run_classify(args) -> int:
    from .classify import classify_file

    classify_file(**_keywords(args))
    # Left to shutdown, gloo's threads can abort a finished process ("terminate called without an active exception");
    # the barrier first, so that no process closes its connections while another still reads from them.
    if group := _process_group():
        group.barrier()
        group.destroy_process_group()
    return 0


def run_check(args) -> int:
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
    check = "check this environment: versions, device, the embedded model, a Jupyter kernel"
    commands.add_parser("check", help=check).set_defaults(run=run_check)
    add_bench_parser(commands)
    add_classify_parser(commands)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:  # one line; while classify scores, classify.Stopped says what it kept instead
        print("error: interrupted", file=sys.stderr)
        return 130
    except ImportError as error:  # a sub-command imports its requirements as it runs (check itself needs none)
        print(f"error: {error}: python -m helpers check lists what is missing, with each fix", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, OSError) as error:
        print(f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
        if isinstance(error.__cause__, KeyboardInterrupt):  # classify's Stopped: Ctrl-C while it scored
            return 130
        # Wait until every process has said a shared failure: the launcher, seeing one exit, could stop the rest first.
        from .processes import ProcessFailure

        if isinstance(error, ProcessFailure) and (group := _process_group()):
            group.barrier()
        return 2


if __name__ == "__main__":
    sys.exit(main())
