"""What a presented credential is: the token of an `Authorization` value, and the digest an
inbound key is configured under. A credential itself is never kept or logged."""

from __future__ import annotations

import hashlib


def hash_key(key: str) -> str:
    """The sha256 hex digest under which an inbound key is configured (`auth.keys[].sha256`)."""
    return hashlib.sha256(key.encode()).hexdigest()


def bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else value.strip()
