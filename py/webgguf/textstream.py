"""From generated token ids to streamed text, with stop conditions.

Both backends feed ids here one at a time. The stream turns them into complete UTF-8 text
(through the tokenizer's incremental decoder), stops on end-of-generation tokens, stop strings
and the token budget, and never emits text that might turn out to be the start of a stop string.
"""


class TokenStream:
    def __init__(self, tokenizer, max_tokens: int, stop: list[str] = (), ignore_eos: bool = False):
        """ignore_eos: end-of-generation ids are text like any other (benchmarks that must decode exactly
        max_tokens tokens)."""
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.stop = [s for s in stop if s]
        self.eog_ids = frozenset() if ignore_eos else frozenset(tokenizer.eog_ids)
        self.ids: list[int] = []  # generated ids, the stopping token excluded
        self.text = ""  # all text emitted so far
        self.finish_reason: str | None = None if max_tokens > 0 else "length"
        self._decoder = tokenizer.incremental_decoder()
        self._held = ""  # decoded text not yet emitted: it may be the start of a stop string

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, token_id: int) -> str:
        """Take the next generated id; return the text that may be shown now ('' if none)."""
        if self.finished:
            return ""
        if token_id in self.eog_ids:
            self.finish_reason = "stop"
            return self._release(self._held + self._decoder.flush())
        self.ids.append(token_id)
        pending = self._held + self._decoder.feed(token_id)
        if len(self.ids) >= self.max_tokens:
            self.finish_reason = "length"
            pending += self._decoder.flush()
        for s in self.stop:
            at = pending.find(s)
            if at >= 0:
                self.finish_reason = "stop"
                return self._release(pending[:at])
        if self.finished:
            return self._release(pending)
        keep = self._longest_stop_prefix_suffix(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._release(pending[: len(pending) - keep])

    def _release(self, text: str) -> str:
        if self.finished:
            self._held = ""
        self.text += text
        return text

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
