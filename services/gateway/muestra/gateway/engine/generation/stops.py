"""Stop strings: cut the text exactly before the first match, even when a match spans tokens.

Text that could still be the start of a stop string is held back until the next delta
decides it, so a client never sees text that a later stop would have removed.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str], include_stop: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop
        self.text = ""  # everything decoded so far
        self.sent = 0  # how much of it has been released
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """Add decoded text; return the part that is safe to send now."""
        if self.matched is not None:
            return ""
        search_from = max(0, self.sent - max((len(s) for s in self.stops), default=0) + 1)
        self.text += delta
        if not self.stops:
            return self._release(len(self.text))
        first = None
        for stop in self.stops:
            at = self.text.find(stop, search_from)
            if at != -1 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            at, stop = first
            self.matched = stop
            return self._release(at + len(stop) if self.include_stop else at)
        return self._release(len(self.text) - self._held_back())

    def flush(self) -> str:
        """At the end of generation (no stop matched): release whatever was held back."""
        if self.matched is not None:
            return ""
        return self._release(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _release(self, end: int) -> str:
        end = max(end, self.sent)
        out = self.text[self.sent : end]
        self.sent = end
        return out
