"""Compaction hooks: HTTP webhooks told about compactions (as Claude Code's PreCompact and
PostCompact hooks are).

`pre_compact` is called before each summary is requested (on the request path and ahead of
time; not while the summarizer cools down after failures, when none is) and may answer
`{"instructions": "..."}`, added to the summarizer's instructions; it is waited for
`timeout_seconds` at most. `post_compact` is told each compaction's outcome, in the
background. Neither ever fails a request: a hook that times out, errs or has too many calls
under way is left out (a metric and a log line say so). No message, summary or anchor text
is sent unless the hook says `include_text`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson

import policies
from proxy.compaction.summarizer import MAX_INSTRUCTIONS, GuardedSummarizer
from proxy.compaction.turn import Turn
from proxy.config import Hook
from proxy.config import Hooks as HooksSettings
from proxy.config.egress import basic_credentials
from proxy.errors import AnswerTooLarge, HookFailed, StreamBroken
from proxy.observability.metrics import Metrics
from proxy.upstream.answer import read_whole
from proxy.upstream.http1 import HTTPError
from proxy.upstream.pool import Pool, Progress

log = logging.getLogger("compaction_proxy")

T = TypeVar("T")
# A hook answers with instructions of at most MAX_INSTRUCTIONS characters: far less than this.
MAX_ANSWER_BYTES = 64 * 1024


class Hooks:
    def __init__(self, settings: HooksSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._pools: dict[str, tuple[Pool, str]] = {}  # by URL: its pool, and its target
        self._in_flight = {"pre_compact": 0, "post_compact": 0}
        self._background: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for pool, _ in self._pools.values():
            pool.close()

    def summarizer(self, turn: Turn, llm: GuardedSummarizer, *, ahead: bool) -> policies.Summarizer:
        """`llm`, asking `pre_compact` first for instructions of its own (`ahead`: a summary
        made ahead of time, off the request path), unless `llm` is cooling down (it will fail
        at once: the instructions would go unused, and the request wait for them)."""
        hook = self.settings.pre_compact
        if hook is None:
            return llm

        async def hooked(request: policies.SummaryRequest) -> str:
            extra = None
            if not llm.cooling and self._admitted("pre_compact", hook):
                payload = {**_about(turn, "pre_compact"), "ahead": ahead}
                payload |= _summary_request(request, include_text=hook.include_text)
                extra = await self._call("pre_compact", hook, payload, _instructions)
            if extra:
                given = request.instructions
                joined = f"{given}\n\n{extra}" if given else extra
                request = dataclasses.replace(request, instructions=joined)
            return await llm(request)

        return hooked

    def compacted(
        self,
        turn: Turn,
        result: policies.Compaction,
        *,
        action: str,
        tokens_before: int,
        reactive: bool,
    ) -> None:
        """Tell `post_compact` what a compaction did, in the background."""
        plan = result.plan
        self._post_compact(
            turn,
            action=action,
            reactive=reactive,
            tokens=(tokens_before, result.tokens_after),
            summary=plan.summary,
            covers=plan.cut,
            decisions=result.decisions,
            anchors=plan.anchor_block,
            anchors_complete=result.anchors_complete,
        )

    def summarized(self, turn: Turn, summary: policies.Summary, *, tokens_after: int) -> None:
        """Tell `post_compact`, in the background, that the whole history of `turn` became
        `summary` (a provider compaction: no layer ran, no anchor is kept)."""
        self._post_compact(
            turn,
            action="degraded" if summary.kind == "digest" else "compacted",
            reactive=False,
            tokens=(turn.tokens_before, tokens_after),
            summary=summary,
            covers=len(turn.chain.digests),
            decisions=(),
            anchors=None,
            anchors_complete=True,
        )

    def _post_compact(
        self,
        turn: Turn,
        *,
        action: str,
        reactive: bool,
        tokens: tuple[int, int],
        summary: policies.Summary | None,
        covers: int,
        decisions: Sequence[policies.Decision],
        anchors: str | None,
        anchors_complete: bool,
    ) -> None:
        hook = self.settings.post_compact
        if hook is None or not self._admitted("post_compact", hook):
            return
        told: dict[str, Any] | None = None
        if summary is not None:
            shown = summary.shown
            told = {
                "kind": summary.kind,
                "covers": covers,
                "tokens": turn.limits.counter.text(shown),
                **({"text": shown} if hook.include_text else {}),
            }
        before, after = tokens
        payload: dict[str, Any] = {
            **_about(turn, "post_compact"),
            "action": action,
            "reactive": reactive,
            "tokens": {**_levels(turn), "before": before, "after": after},
            "decisions": [dataclasses.asdict(d) for d in decisions],
            "summary": told,
            "anchors": {
                "kept": 0 if anchors is None else anchors.count("\n") + 1,
                "complete": anchors_complete,
                **({"text": anchors} if hook.include_text else {}),
            },
        }
        task = asyncio.create_task(self._call("post_compact", hook, payload, _ignored))
        # Kept referenced until done, cancelled at shutdown.
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _admitted(self, name: str, hook: Hook) -> bool:
        """Whether a call may start: fewer than `max_in_flight` are under way (else it is
        dropped, counted). An admitted call is counted under way until `_call` ends it."""
        if self._in_flight[name] >= hook.max_in_flight:
            self._failed(name, "dropped", "too many calls under way")
            return False
        self._in_flight[name] += 1
        return True

    async def _call(
        self, name: str, hook: Hook, payload: dict[str, Any], read: Callable[[Any], T]
    ) -> T | None:
        """`read` of the hook's JSON answer (None for an empty one); None when the call
        failed, counted and logged: a hook never fails what called it."""
        try:
            async with asyncio.timeout(hook.timeout_seconds):
                answer = read(await self._post(hook, payload))
        except TimeoutError:
            self._failed(name, "timeout", f"no answer within {hook.timeout_seconds:g} s")
            return None
        except (HookFailed, AnswerTooLarge) as exc:
            self._failed(name, "error", str(exc))
            return None
        except (HTTPError, StreamBroken, OSError, ValueError) as exc:
            self._failed(name, "error", type(exc).__name__)  # its text may name the host
            return None
        finally:
            self._in_flight[name] -= 1
        self.metrics.hook_calls.labels(name, "ok").inc()
        return answer

    async def _post(self, hook: Hook, payload: dict[str, Any]) -> Any:
        pool, target = self._pool(hook)
        sent = orjson.dumps(payload)
        response = await pool.request("POST", target, self._headers(hook), sent, Progress())
        body = await read_whole(response, hook.timeout_seconds, MAX_ANSWER_BYTES)
        response.release()
        if not 200 <= response.status < 300:
            raise HookFailed(f"status {response.status}")
        return orjson.loads(body) if body.strip() else None

    def _pool(self, hook: Hook) -> tuple[Pool, str]:
        """The pool of connections to the hook's URL (as many as calls it may have under way),
        and the target of its URL."""
        found = self._pools.get(hook.url)
        if found is None:
            parts = urlsplit(hook.url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            server = parts.netloc.rpartition("@")[2]  # without the user and password
            pool = Pool(f"{parts.scheme}://{server}", hook.max_in_flight)
            found = self._pools[hook.url] = (pool, target)
        return found

    @staticmethod
    def _headers(hook: Hook) -> list[tuple[str, str]]:
        """The headers of the hook's calls: its own, a user and password in its URL as Basic
        credentials, and the body's type (the pool sets Host and Content-Length)."""
        parts = urlsplit(hook.url)
        headers = {name.lower(): (name, value) for name, value in hook.headers.items()}
        basic = basic_credentials(parts)
        if basic is not None and "authorization" not in headers:
            headers["authorization"] = ("Authorization", basic)
        headers["content-type"] = ("Content-Type", "application/json")
        return list(headers.values())

    def _failed(self, name: str, outcome: str, reason: str) -> None:
        self.metrics.hook_calls.labels(name, outcome).inc()
        # The hook's name and why: never its URL or headers (they may hold a credential).
        log.warning("compaction hook failed", extra={"hook": name, "reason": reason})


def _about(turn: Turn, hook: str) -> dict[str, Any]:
    """What every call says: the hook, the session and the request's facts (no text)."""
    request = turn.request
    return {
        "hook": hook,
        "session": request.key,
        "policy": request.policy.name,
        "api": request.dialect.name,
        "model": request.parsed.model,
        "shadow": request.shadow,
        "layers": [spec.name for spec in request.policy.compaction.layers],
    }


def _levels(turn: Turn) -> dict[str, int]:
    budget = turn.budget
    return {
        "limit": budget.limit,
        "compact_at": budget.compact_tokens,
        "target": budget.target_tokens,
    }


def _summary_request(request: policies.SummaryRequest, *, include_text: bool) -> dict[str, Any]:
    previous = request.previous
    summary: dict[str, Any] = {
        "start": request.start,
        "end": request.end,
        "messages": len(request.evicted),
        "max_tokens": request.max_tokens,
        "previous": None if previous is None else previous.kind,
    }
    if include_text:
        summary["evicted"] = request.evicted
        summary["previous_text"] = None if previous is None else previous.shown
        summary["instructions"] = request.instructions
    return {"summary": summary}


def _instructions(answer: Any) -> str | None:
    """The instructions a pre_compact answer adds; HookFailed when it is no such answer."""
    if answer is None:
        return None
    if not isinstance(answer, dict):
        raise HookFailed('the answer is not a JSON object: {"instructions": "..."}')
    value = answer.get("instructions")
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_INSTRUCTIONS:
        raise HookFailed(f"'instructions' is not a string of at most {MAX_INSTRUCTIONS} characters")
    return value.strip() or None


def _ignored(answer: Any) -> None:
    """What post_compact answers is not read."""
