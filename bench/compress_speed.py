"""How long compress_tool_results takes to compress one 100 KB tool output, by kind and level.

    .venv/bin/python bench/compress_speed.py [--runs 50]

Each kind of output is made at 100 KB (102,400 characters or a little over), with a few errors
in it, and compressed at level 1 (lossless) and at each default lossy level (1,000 and 250
tokens: 4,000 and 1,000 characters), `--runs` times after one warm-up run, each time as its
first compression (the caches of its error lines and blobs emptied); the figure is the p50
and the max of those runs (issue 25's target: 5 ms at most). The result's size is shown
beside it.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compaction import conditions

from policies import CompressToolResultsParams
from policies.compress import compress, detect, formats, salience
from policies.layers.compress_tool_results import CHARS_PER_TOKEN

SIZE = 102_400


def grow(line: Callable[[int], str]) -> str:
    lines, size, i = [], 0, 0
    while size < SIZE:
        lines.append(line(i))
        size += len(lines[-1]) + 1
        i += 1
    return "\n".join(lines)


def outputs() -> dict[str, str]:
    rng = random.Random(0)
    records = []
    while len(json.dumps(records, indent=2)) < SIZE:
        i = len(records)
        records.append({"id": i, "status": "ok", "sku": f"SKU-{rng.randrange(10**5)}", "qty": i})
    records[len(records) // 3]["status"] = "error"
    blob = base64.b64encode(rng.randbytes(SIZE * 3 // 4)).decode()
    return {
        "json records": json.dumps(records, indent=2),
        "log": grow(
            lambda i: (
                f"[{i:05d}] ERROR E{i}: connection refused"
                if i % 700 == 350
                else f"[{i:05d}] INFO worker {i % 7} handled request {i} in {i % 97} ms"
            )
        ),
        "search": grow(
            lambda i: f"src/pkg{i % 40}/module_{i % 13}.py:{i}:    value = compute({i})"
        ),
        "diff": "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1,9000 +1,9000 @@\n"
        + grow(lambda i: f"{' +-'[i % 3]}line {i} of the module body"),
        "html": "<!DOCTYPE html><html><body>"
        + grow(lambda i: f"<div class='row'><p>Item {i} &amp; its <b>status</b></p></div>"),
        "blob": f"payload follows\n{blob}\nend",
        "text": grow(lambda i: f"sentence {i} of a long document without any structure at all"),
    }


def forget() -> None:
    """Empty the compressors' caches of a text's error lines, blobs and search groups: each
    run is the output's first compression."""
    salience.error_lines.cache_clear()
    formats._blob_runs.cache_clear()
    formats.search_groups.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    print(conditions())
    levels = {"1 (lossless)": None} | {
        f"{i + 2} ({tokens} tokens)": tokens * CHARS_PER_TOKEN
        for i, tokens in enumerate(CompressToolResultsParams().levels)
    }
    print("\n| output (100 KB) | kind | level | p50 ms | max ms | result chars |")
    print("|---|---|---|---|---|---|")
    for name, text in outputs().items():
        for level, budget in levels.items():
            compress(text, budget)  # warm-up: compiled patterns
            times = []
            for _ in range(args.runs):
                forget()
                started = time.perf_counter()
                result = compress(text, budget)
                times.append(time.perf_counter() - started)
            size = "unchanged" if result is None else f"{len(result.text):,}"
            print(
                f"| {name} | {detect(text)} | {level} | {statistics.median(times) * 1000:.2f} |"
                f" {max(times) * 1000:.2f} | {size} |"
            )


if __name__ == "__main__":
    main()
