"""Token counting: the `Counter` protocol the engine counts with, and estimates for image,
audio and file parts (what needs no tokenizer).

The proxy's implementation, with tiktoken and OpenAI's per-message formula, is
`proxy/models/tokens.py`; the engine never imports a tokenizer.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping
from typing import Any, Protocol

from policies.message import Message

IMAGE_LOW_DETAIL_TOKENS = 85
IMAGE_TILE_TOKENS = 170
IMAGE_UNKNOWN_SIZE_TOKENS = 765  # a 1024x1024 image at high detail, OpenAI's usual example
DOCUMENT_BYTES_PER_TOKEN = 8  # PDF bytes are mostly structure and compressed streams
AUDIO_BYTES_PER_TOKEN = 1600  # ~10 tokens a second of 128 kbit/s audio
_HEADER_BYTES = 65536  # enough to find the size of a JPEG after its EXIF block


class Counter(Protocol):
    """Counts tokens the way the upstream model will; injected by the caller."""

    def message(self, message: Message) -> int:
        """Tokens of one message, including the per-message overhead."""
        ...

    def text(self, text: str) -> int:
        """Tokens of a piece of text."""
        ...

    def head(self, text: str, tokens: int) -> str:
        """The first `tokens` tokens of `text`."""
        ...


def media_tokens(part: Mapping[str, Any]) -> int:
    """Estimated tokens of a non-text content part (0 for text and unknown parts).

    Images follow OpenAI's rule: 85 at low detail, else 85 + 170 per 512-pixel tile after
    scaling into 2048x2048 and the short side down to 768; the size is read from a data
    URL's header, and taken as 1024x1024 when it is not known. Documents and audio are
    estimated from the size of their data. An opaque part, `{"type": "opaque", "tokens": N}`,
    stands for content nobody can read (encrypted reasoning, a reference to a stored item, an
    Anthropic server tool's result) and costs the N tokens its dialect estimated.
    """
    kind = part.get("type")
    if kind == "opaque":
        tokens = part.get("tokens")
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
    payload = part.get(kind) if isinstance(kind, str) else None
    if not isinstance(payload, dict):
        return 0
    if kind == "image_url":
        if payload.get("detail") == "low":
            return IMAGE_LOW_DETAIL_TOKENS
        size = _image_size(_data_url_head(payload.get("url")))
        return image_tokens(*size) if size else IMAGE_UNKNOWN_SIZE_TOKENS
    if kind == "file":
        data = payload.get("file_data")
        if not isinstance(data, str):
            return IMAGE_UNKNOWN_SIZE_TOKENS
        return max(IMAGE_LOW_DETAIL_TOKENS, _decoded_size(data) // DOCUMENT_BYTES_PER_TOKEN)
    if kind == "input_audio":
        data = payload.get("data")
        return _decoded_size(data) // AUDIO_BYTES_PER_TOKEN if isinstance(data, str) else 0
    return 0


def image_tokens(width: int, height: int) -> int:
    """OpenAI's token cost of a high-detail image of this size."""
    if width <= 0 or height <= 0:
        return IMAGE_UNKNOWN_SIZE_TOKENS
    fit = min(1.0, 2048 / max(width, height))
    short = min(1.0, 768 / (min(width, height) * fit))
    tiles = math.ceil(width * fit * short / 512) * math.ceil(height * fit * short / 512)
    return IMAGE_LOW_DETAIL_TOKENS + IMAGE_TILE_TOKENS * tiles


def _decoded_size(data: str) -> int:
    encoded = data.partition(",")[2] if data.startswith("data:") else data
    return len(encoded) * 3 // 4


def _data_url_head(url: object) -> bytes:
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url[:100]:
        return b""
    encoded = url.partition(",")[2][: _HEADER_BYTES // 3 * 4]
    try:
        return base64.b64decode(encoded[: len(encoded) // 4 * 4])
    except (binascii.Error, ValueError):
        return b""


def _image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG, GIF, JPEG or WebP header, if it is one."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        return _webp_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 <= len(data) and data[at] == 0xFF:
        marker, length = data[at + 1], struct.unpack(">H", data[at + 2 : at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":
        return (
            1 + int.from_bytes(data[24:27], "little"),
            1 + int.from_bytes(data[27:30], "little"),
        )
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None
