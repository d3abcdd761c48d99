"""The admin API from the command line (`compaction-proxy sessions ...`): a small HTTP client
of a running proxy's `/admin/...` endpoints (proxy/server/admin.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from proxy.errors import ProxyError

TOKEN_VARIABLE = "COMPACTION_PROXY_ADMIN_TOKEN"  # noqa: S105 (a variable name)
TIMEOUT_SECONDS = 10.0


class AdminCallFailed(ProxyError):
    """An admin call without a good answer: the proxy unreachable, the token refused, an error."""


class AdminClient:
    def __init__(self, url: str, token: str, *, timeout: float = TIMEOUT_SECONDS) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise AdminCallFailed(f"--url must be http://host:port or https://…, not {url!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def show(self, key: str) -> Any:
        """A session's state: plans, summary, decisions, memory candidates, calibration,
        what the upstream's prompt cache read and wrote."""
        return self._call("GET", f"/admin/sessions/{_quoted(key)}")

    def reset(self, key: str) -> Any:
        self._call("DELETE", f"/admin/sessions/{_quoted(key)}")
        return {"key": key, "status": "reset"}

    def compact(self, key: str, instructions: str) -> Any:
        """Compact on the session's next request, with these instructions for its summary."""
        body = {"instructions": instructions}
        return self._call("POST", f"/admin/sessions/{_quoted(key)}/compact", body)

    def key(self, tenant: str, session: str) -> Any:
        """The key of a tenant's session (what `x-compaction-session` says)."""
        query = urllib.parse.urlencode({"tenant": tenant, "session": session})
        return self._call("GET", f"/admin/session-key?{query}")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 (the scheme is checked above)
            self.url + path, data=data, method=method
        )
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise AdminCallFailed(self._refusal(exc.code, exc.read())) from None
        except (urllib.error.URLError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminCallFailed(f"cannot reach the proxy at {self.url}: {reason}") from None
        except TimeoutError:
            raise AdminCallFailed(
                f"no answer from the proxy at {self.url} within {self.timeout:g} s"
            ) from None
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError:
            raise AdminCallFailed(
                f"{self.url} did not answer with JSON: is it the proxy?"
            ) from None

    def _refusal(self, status: int, payload: bytes) -> str:
        message = _error_message(payload)
        if status == 401:
            return f"the proxy refused the admin token (401): check --token or ${TOKEN_VARIABLE}"
        # "Invalid URL" from a proxy older than the one that says the admin API is off.
        if status == 404 and message.startswith(("Invalid URL", "The admin API is off")):
            return f"the admin API is off at {self.url} (404): set admin.token in its config"
        return f"the proxy answered {status}: {message or 'no message'}"


def _quoted(key: str) -> str:
    return urllib.parse.quote(key, safe="")


def _error_message(payload: bytes) -> str:
    """The message of an error body in OpenAI's shape, else the body's start."""
    try:
        error = json.loads(payload).get("error", {})
        return str(error.get("message", ""))
    except (ValueError, AttributeError):
        return payload[:200].decode("utf-8", "replace").strip()
