"""The compressors' limits, configurable per policy (the `limits` of compress_tool_results)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    """How much of what is not salient a lossy form keeps around what is.

    `context_lines` around each error or failure; at most `warning_lines` warnings; a JSON
    array, a search's matches in one file or a diff's hunk keep at most `items` entries
    (besides the salient ones) at the first lossy level, fewer at the next ones; text runs of
    base64 or minified code of `blob_chars` or more are elided with their size.
    """

    context_lines: int = 2
    warning_lines: int = 20
    items: int = 20
    blob_chars: int = 256

    def __post_init__(self) -> None:
        negative = [f.name for f in fields(self) if getattr(self, f.name) < 0]
        if negative:
            raise ValueError(f"{', '.join(negative)} must not be negative")
        if self.blob_chars < 64:
            raise ValueError("blob_chars must be at least 64")
