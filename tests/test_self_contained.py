"""The repository stands on its own: no file points at documents or data outside it, and the
recorded conversations the tests and benchmarks replay are in tests/data."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests/data"
TRACES = ("tau_airline_gpt4o.jsonl", "swe_agent.jsonl")
# Spelled in parts, so that this file does not hold the very pointers it looks for.
SHARED = b"shared"
OUTSIDE = (b"../" + SHARED, b"/work/" + SHARED, b"DESIGN" + b".md")


def repository_files() -> list[Path]:
    """Every file git tracks, and every new one it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [ROOT / name for name in sorted(set(listed.decode().split("\0"))) if name]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in repository_files():
        relative = path.relative_to(ROOT)
        # The data keeps its recorded text; this file names what it looks for.
        if relative.parts[:2] == ("tests", "data") or path == Path(__file__).resolve():
            continue
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if any(text in line for text in OUTSIDE):
                found.append(f"{relative}:{number}: {line.decode(errors='replace').strip()}")
    assert found == [], "\n".join(found)


def test_the_recorded_conversations_are_in_the_repository() -> None:
    assert (DATA / "README.md").is_file()
    assert (DATA / "LICENSES.md").is_file()
    for name in TRACES:
        lines = (DATA / name).read_text().splitlines()
        assert lines, name
        for line in lines:
            record = json.loads(line)
            assert {"id", "source", "messages"} <= record.keys(), name
            assert record["messages"], name
