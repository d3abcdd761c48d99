"""Model windows from litellm's shipped model map, read without importing litellm."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from proxy.models.catalog import MAP_FILE, ModelCatalog, ModelInfo

ROOT = Path(__file__).resolve().parent.parent


def shipped_map() -> dict[str, dict[str, object]]:
    spec = importlib.util.find_spec("litellm")
    assert spec and spec.submodule_search_locations
    data: dict[str, dict[str, object]] = orjson.loads(
        Path(spec.submodule_search_locations[0], MAP_FILE).read_bytes()
    )
    return data


@pytest.fixture(scope="module")
def catalog() -> ModelCatalog:
    return ModelCatalog()


@pytest.mark.parametrize(
    ("model", "window", "output"),
    [
        ("gpt-4o", 128_000, 16_384),
        ("openai/gpt-4o", 128_000, 16_384),  # provider prefix dropped
        ("openrouter/openai/gpt-4o", 128_000, 16_384),
        ("gpt-4o-2024-08-06", 128_000, 16_384),  # in the map itself
        ("gpt-4o-2031-01-01", 128_000, 16_384),  # a snapshot the map does not know yet
        ("gpt-4-0613", 8_192, 4_096),
    ],
)
def test_known_models(catalog: ModelCatalog, model: str, window: int, output: int) -> None:
    assert catalog.lookup(model) == ModelInfo(window, output)


@pytest.mark.parametrize("model", ["gpt-4o-mini-foo", "my-local-llama", "", "sample_spec"])
def test_unknown_models(catalog: ModelCatalog, model: str) -> None:
    assert catalog.lookup(model) == ModelInfo(None, None)


def test_agrees_with_the_map_for_every_model(catalog: ModelCatalog) -> None:
    checked = 0
    for name, entry in shipped_map().items():
        window = entry.get("max_input_tokens") or entry.get("max_tokens")
        output = entry.get("max_output_tokens")
        if isinstance(window, int) and isinstance(output, int) and min(window, output) > 0:
            assert catalog.lookup(name) == ModelInfo(window, output), name
            checked += 1
    assert checked > 1_000


def test_provider_entry_wins_over_the_bare_name(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    entries = {"m": {"max_input_tokens": 8_000}, "local/m": {"max_input_tokens": 4_000}}
    path.write_bytes(orjson.dumps(entries | {"old": {"max_tokens": 2_048}}))
    catalog = ModelCatalog(path)
    assert catalog.lookup("local/m").context_window == 4_000
    assert catalog.lookup("gateway/local/m").context_window == 4_000  # nearest prefix first
    assert catalog.lookup("other/m").context_window == 8_000
    assert catalog.lookup("old") == ModelInfo(2_048, None)  # max_tokens when no max_input_tokens


def test_reads_once_and_memoises(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    catalog = ModelCatalog(path)  # lazy: nothing is read yet
    path.write_bytes(orjson.dumps({"a": {"max_input_tokens": 1_000, "max_output_tokens": 100}}))
    assert catalog.lookup("a") == ModelInfo(1_000, 100)
    path.write_bytes(orjson.dumps({"b": {"max_input_tokens": 2_000}}))
    assert catalog.lookup("a") == ModelInfo(1_000, 100)
    assert catalog.lookup("b") == ModelInfo(None, None)


@pytest.mark.parametrize("content", [None, b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_missing_or_corrupt_map_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes | None
) -> None:
    path = tmp_path / "map.json"
    if content is not None:
        path.write_bytes(content)
    catalog = ModelCatalog(path)
    with caplog.at_level(logging.WARNING, logger="proxy.models.catalog"):
        assert catalog.lookup("gpt-4o") == ModelInfo(None, None)
        assert catalog.lookup("gpt-4o-mini") == ModelInfo(None, None)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert str(path) in caplog.records[0].getMessage()


@pytest.mark.subprocess
def test_does_not_import_litellm() -> None:
    code = (
        "import sys\n"
        "from proxy.models.catalog import ModelCatalog\n"
        "print(ModelCatalog().lookup('openai/gpt-4o').context_window, 'litellm' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["128000", "False"]
