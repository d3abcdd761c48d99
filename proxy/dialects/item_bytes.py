"""The client's bytes of each item of a conversation, as the split of its body found them
(`proxy.dialects.raw_items`): what goes upstream for the items no layer touched."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import overload


class ItemBytes(Sequence[bytes]):
    """The client's bytes of each item of a conversation: those of a known body's items, each
    cut from the body's when asked for (a turn that goes upstream as it came asks for none),
    then those of the items after them."""

    def __init__(self, prefix: bytes, offsets: array[int], after: list[bytes]) -> None:
        self._prefix = prefix
        self._offsets = offsets
        self._known = len(offsets) // 2
        self._after = after

    def __len__(self) -> int:
        return self._known + len(self._after)

    def run(self, start: int, stop: int) -> list[bytes]:
        """The bytes of the items from `start` to `stop` (not included) in as few pieces as
        they are in: the known items' in one, with the client's bytes between them, each of
        the others alone. Written as they are, they are the client's array of those items."""
        known = self._known
        if stop <= known:  # the usual run: of known items only, one piece
            if start < stop:
                return [self._prefix[self._offsets[2 * start] : self._offsets[2 * stop - 1]]]
            return []
        pieces = self.run(start, known) if start < known else []
        return pieces + self._after[max(start - known, 0) : stop - known]

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
            if index < 0:
                raise IndexError(index)
        if index < self._known:
            return self._prefix[self._offsets[2 * index] : self._offsets[2 * index + 1]]
        return self._after[index - self._known]
