"""The retrieval tool's side of a request's view: the originals of the tool outputs it shows
cut are kept with the session, each marked with its handle, and once the session keeps any,
every request of it carries the tool (the tool list changes once, then stays byte-stable).

Under shadow mode originals are kept but the client's own bytes go upstream: no handle, no
tool. With the policy's retrieval off nothing is kept, marked or added.
"""

from __future__ import annotations

import dataclasses
import logging

from policies import retrieval
from proxy.compaction.turn import ClientRequest
from proxy.config import Config
from proxy.config.retrieval import results_kept as engine_results_kept
from proxy.config.schema import named
from proxy.dialects import Entries
from proxy.dialects.retrieval import TOOL_CALLS
from proxy.errors import StoreUnavailable
from proxy.sessions.originals import Originals, StoredOriginals, ViewOriginals

log = logging.getLogger("compaction_proxy")


def results_kept(config: Config) -> Config:
    """The config with each retrieving policy's layers kept off the retrieval tool's results
    (`proxy.config.retrieval.results_kept`), for the request path; the file's as it is for
    `check-config`."""
    kept = {
        name: named(
            dataclasses.replace(
                policy, compaction=engine_results_kept(policy.compaction, policy.retrieval)
            ),
            name,
        )
        for name, policy in config.policies.items()
    }
    return dataclasses.replace(config, policies=kept)


class KeptOriginals:
    def __init__(self, originals: Originals, limits: StoredOriginals) -> None:
        self.originals = originals
        self.limits = limits

    async def load(self, request: ClientRequest) -> ViewOriginals | None:
        """The session's index, when its policy keeps originals; None when it does not or the
        store failed (then the request goes without handles and without the tool)."""
        if not request.policy.retrieval.enabled or request.parsed.opaque_reason is not None:
            return None
        if request.originals is not None:
            return ViewOriginals(request.originals)
        try:
            return ViewOriginals(await self.originals.index(request.key))
        except StoreUnavailable:
            log.warning("originals unavailable: the request goes without the retrieval tool")
            return None

    def body(
        self, request: ClientRequest, entries: Entries | None, kept: ViewOriginals | None
    ) -> tuple[bytes, bool]:
        """What goes upstream for the view, and whether it carries the retrieval tool."""
        if kept is None:
            return request.body(entries), False
        settings = request.policy.retrieval
        if entries is not None:
            shown = list(entries)
            for cut in retrieval.elided(request.messages, entries, settings.tool_name):
                data = cut.text.encode()
                present = cut.handle in kept.index.kept or cut.handle in kept.new
                if not present and cut.handle not in kept.index.gone:
                    present = len(data) <= self.limits.session_bytes
                    if present:
                        kept.new[cut.handle] = data
                index, message = shown[cut.entry]
                marked = retrieval.marked(
                    message, cut.handle, kept=present, tool_name=settings.tool_name
                )
                shown[cut.entry] = (index, marked)
            entries = shown
        body = request.body(entries)
        if request.shadow or (kept.index.empty and not kept.new):
            return body, False
        calls = TOOL_CALLS[request.dialect.name]
        return calls.with_tool(body, calls.tool(settings.tool_name, settings.description)), True

    async def keep(self, request: ClientRequest, kept: ViewOriginals | None) -> None:
        """Store the originals the view added (fail open: their markers then read gone)."""
        if kept is None or not kept.new:
            return
        try:
            await self.originals.add(request.key, kept.new)
        except StoreUnavailable:
            log.warning("originals not kept: the session store failed")
        kept.new = {}

    async def read(self, key: str, handle: str) -> bytes | None:
        return await self.originals.read(key, handle)
