"""Who is calling: the tenant whose sessions a request may see.

With inbound keys configured the tenant is the id of the key presented; otherwise it is a
hash of the caller's upstream credential (`Authorization`, Azure's `api-key` or Anthropic's
`x-api-key`). A credential itself is never kept or logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from proxy.config import Auth
from proxy.credentials import bearer, hash_key
from proxy.errors import Unauthorized

ANONYMOUS = "anonymous"


class Tenants:
    """Resolves the tenant of a request from its headers."""

    def __init__(self, auth: Auth) -> None:
        self.auth = auth
        self.header = auth.header.lower()
        self._keys = {key.sha256: key.id for key in auth.keys}

    @property
    def enforced(self) -> bool:
        return bool(self._keys)

    def tenant(self, headers: Mapping[str, str]) -> str:
        if self._keys:
            return self._inbound(headers)
        credential = (
            headers.get("authorization") or headers.get("api-key") or headers.get("x-api-key")
        )
        if not credential:
            return ANONYMOUS
        digest = hashlib.sha256(bearer(credential).encode()).hexdigest()
        return f"cred-{digest[:24]}"

    def _inbound(self, headers: Mapping[str, str]) -> str:
        presented = headers.get(self.header)
        if not presented:
            raise Unauthorized(f"missing proxy key: send it in the {self.auth.header} header")
        digest = hash_key(bearer(presented))
        # Compare against every configured hash in constant time, so timing reveals nothing.
        found = None
        for known, key_id in self._keys.items():
            if hmac.compare_digest(known, digest):
                found = key_id
        if found is None:
            raise Unauthorized("invalid proxy key")
        return found
