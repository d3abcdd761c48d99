"""What a session's last turn worked out of its history, for its next turn to go on from."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from policies.chain import Chain
from proxy.memo import MessageDigests, make_room
from proxy.models.tokens import TokenCounter


class Counts(list[int]):
    """The tokens of each message of a history, and of all the messages before each (`before`,
    one more: the history's tokens last), made once a history: a run of messages is counted
    as a difference of two, not message by message (`Turn.tokens`)."""

    __slots__ = ("before",)

    def __init__(self, counts: Iterable[int] = ()) -> None:
        super().__init__(counts)
        self.before = [0, *itertools.accumulate(self)]

    def then(self, new: Sequence[int]) -> Counts:
        """These counts followed by `new` (only theirs summed)."""
        counts = Counts()
        counts += self
        counts += new
        sums = itertools.accumulate(new, initial=self.before[-1])
        next(sums)  # the tokens before them, which `before` ends with
        counts.before = [*self.before, *sums]
        return counts


class _Seen(NamedTuple):
    keys: Sequence[int]  # the messages' content keys
    counter: TokenCounter
    counts: Counts
    chain: Chain


class SessionHistories:
    """Each message's tokens and the chain of the history that each of the `size` sessions
    seen last sent last, by the messages' content keys.

    A session's next turn sends that history again with new messages after it: its counts and
    chain are the last turn's and those of the new messages alone (one compare of the keys,
    not two memo look-ups of every message of a long history: 0.2-0.3 ms at 1,052 messages).
    Any other history is looked up message by message, as before. Content keys are hashes of
    the messages' bytes, so a message changed in place has another key and is looked at again.
    """

    def __init__(self, digests: MessageDigests, size: int = 64) -> None:
        self.digests = digests
        self.size = size
        self._seen: dict[str, _Seen] = {}

    def read(
        self,
        session: str,
        messages: Sequence[Any],
        keys: Sequence[int],
        counter: TokenCounter,
    ) -> tuple[Counts, Chain]:
        """The tokens of each of `messages` (by `counter`) and their chain, given their
        `content_keys`."""
        seen = self._seen.pop(session, None)  # put back last: the most recently seen
        # The dialects' keys of a known body are the same objects turn after turn
        # (`KnownItems`): their compare is mostly one of pointers, and none for a body sent
        # again (the same list: no copy of its first part to compare).
        if (
            seen is None
            or seen.counter is not counter
            or (keys is not seen.keys and keys[: len(seen.keys)] != seen.keys)
        ):
            seen = _Seen((), counter, Counts(), Chain([]))
        known = len(seen.counts)
        if known == len(keys):
            counts, chain = seen.counts, seen.chain
        else:
            new, new_keys = messages[known:], keys[known:]
            counts = seen.counts.then(counter.counts(new, new_keys))
            chain = seen.chain.followed_by(self.digests(new, new_keys))
        make_room(self._seen, session, self.size)
        self._seen[session] = _Seen(keys, counter, counts, chain)
        return counts, chain
