"""How long compress_tool_results takes to compress one 100 KB tool output, by kind and level.

    .venv/bin/python bench/compress_speed.py [--runs 50]

Each kind of output is made at 100 KB (102,400 characters or a little over), with a few errors
in it, and compressed at level 1 (lossless) and at each default lossy level (1,000, 250 and 60
tokens: 4,000, 1,000 and 240 characters), `--runs` times after one warm-up run, each time as its
first compression (the caches of its error lines and blobs emptied); the figures are the min
(the nearest to an idle core on a loaded machine), the p50 and the max of those runs (issue
25's target: 5 ms at most). The result's size is shown beside it.

    .venv/bin/python bench/compress_speed.py --instructions [--tree /tmp/before]

counts instead the instructions of each compression under valgrind's callgrind (a figure the
machine's load does not move): the script runs itself under `valgrind --tool=callgrind`, zeroes
the counters before `--runs` compressions of each output and level and dumps them after
(`callgrind_control`), and reads each dump; `--tree` counts another checkout's compressors
in the same way, for a before and after (`git archive REV | tar -x -C DIR`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
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
    from policies.compress import formats, salience

    if hasattr(salience, "_scanned"):  # error lines and warnings, scanned at once
        salience._scanned.cache_clear()
    else:  # checkouts before it
        salience.error_lines.cache_clear()
    formats._blob_runs.cache_clear()
    formats.search_groups.cache_clear()
    if hasattr(formats, "_sizes"):  # not in checkouts before it
        formats._sizes.cache_clear()


def levels() -> dict[str, int | None]:
    """Each default level's name and its budget in characters (None: lossless)."""
    from policies import CompressToolResultsParams
    from policies.layers.compress_tool_results import CHARS_PER_TOKEN

    return {"1 (lossless)": None} | {
        f"{i + 2} ({tokens} tokens)": tokens * CHARS_PER_TOKEN
        for i, tokens in enumerate(CompressToolResultsParams().levels)
    }


def counted_child(runs: int) -> None:
    """Under callgrind: the counters zeroed, each output and level compressed `runs` times,
    then a dump; the order of the dumps printed, one a line."""
    from policies.compress import compress

    pid = str(os.getpid())
    for name, text in outputs().items():
        for level, budget in levels().items():
            compress(text, budget)  # warm-up: compiled patterns
            subprocess.run(["callgrind_control", "--zero", pid], check=True, capture_output=True)
            for _ in range(runs):
                forget()
                compress(text, budget)
            subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
            print(f"{name}\t{level}", flush=True)


def instructions(tree: Path, runs: int) -> dict[tuple[str, str], float]:
    """Millions of instructions per compression of each output and level, by `tree`'s code."""
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as folder:
        profile = Path(folder) / "callgrind.out"
        args = ["valgrind", "--tool=callgrind"]
        args += [f"--callgrind-out-file={profile}", sys.executable, __file__]
        args += ["--child", "--runs", str(runs)]
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
        done = subprocess.run(args, check=True, capture_output=True, text=True, env=env)
        order = [tuple(line.split("\t")) for line in done.stdout.splitlines()]
        dumps = sorted(profile.parent.glob(profile.name + ".*"), key=lambda p: int(p.suffix[1:]))
        figures = {}
        for label, dump in zip(order, dumps, strict=True):
            total = re.search(rb"^(?:summary|totals): (\d+)", dump.read_bytes(), re.M)
            assert total is not None, dump
            figures[(label[0], label[1])] = int(total[1]) / runs / 1e6
        return figures


def count_instructions(trees: list[Path], runs: int) -> None:
    counts = [instructions(tree, runs) for tree in trees]
    names = " | ".join(f"M instructions ({tree})" for tree in trees)
    print(f"\n| output (100 KB) | level | {names} |")
    print("|---|---|" + "---|" * len(trees))
    for name, level in counts[0]:
        figures = " | ".join(f"{count.get((name, level), float('nan')):.1f}" for count in counts)
        print(f"| {name} | {level} | {figures} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--instructions", action="store_true", help="count them (callgrind)")
    parser.add_argument("--tree", type=Path, help="with --instructions: also this checkout's")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        counted_child(args.runs)
        return
    sys.path.insert(0, str(BENCH))
    from compaction import conditions

    print(conditions())
    if args.instructions:
        trees = [BENCH.parent, *([args.tree] if args.tree else [])]
        count_instructions(trees, min(args.runs, 5))
        return
    from policies.compress import compress, detect

    print("\n| output (100 KB) | kind | level | min ms | p50 ms | max ms | result chars |")
    print("|---|---|---|---|---|---|---|")
    for name, text in outputs().items():
        for level, budget in levels().items():
            compress(text, budget)  # warm-up: compiled patterns
            times = []
            for _ in range(args.runs):
                forget()
                started = time.perf_counter()
                result = compress(text, budget)
                times.append(time.perf_counter() - started)
            size = "unchanged" if result is None else f"{len(result.text):,}"
            print(
                f"| {name} | {detect(text)} | {level} | {min(times) * 1000:.2f} |"
                f" {statistics.median(times) * 1000:.2f} |"
                f" {max(times) * 1000:.2f} | {size} |"
            )


if __name__ == "__main__":
    main()
