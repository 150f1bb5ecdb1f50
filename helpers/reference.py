"""The published reference series' own numbers (``../shared/FACTS.md``), shown beside this run's, labelled as
theirs: another model, another machine, so a comparison of ratios, not of absolute speeds (notebooks 00, 02, 03);
and the course's matmul measurements on its other machines (notebook 00, section 2)."""

import pandas as pd

SOURCE = "reference series (Qwen2.5-0.5B-Instruct, Apple M2 Air CPU, float32)"

# Prompt token lengths of its 600 tickets (Qwen tokenizer), and padding everything to the longest prompt.
PROMPT_TOKENS = {"min": 48, "median": 94, "max": 449}
GLOBAL_PADDING_FACTOR = 3.7
# Prefix KV cache on 600 tickets: ms per ticket without and with it.
PREFIX_MS_PER_TICKET = {"without": 308.1, "with": 133.5}
# The one-at-a-time loop against length-sorted batches of 32, and the padding those batches processed.
BATCH32_ITEMS_PER_S = {"loop": 4.2, "sorted": 7.5}
SORTED32_PADDING = 0.076


# Matmul GFLOP/s, (float32, bfloat16), at the model's weight shapes on the course's other 2-core cloud CPUs (torch
# 2.13-2.14, steady best; ../shared/FACTS.md): not the reference series' machine, and not this run's.
MATMUL_GFLOPS = {
    "Intel Xeon, AMX": (292, 2267),
    "AMD EPYC, AVX-512 bf16": (189, 375),
    "Intel Xeon, AVX-512 bf16, no AMX": (245, 160),
    "AMD EPYC, AVX2 only": (124, 1.8),
}


def beside(rows, this_run: str) -> pd.DataFrame:
    """A table of (quantity, reference value, this run's value) rows, with both sources named in the columns."""
    return pd.DataFrame(rows, columns=["quantity", SOURCE, f"this run ({this_run})"]).set_index("quantity")
