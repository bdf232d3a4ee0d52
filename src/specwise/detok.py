"""`Detokenizer`: token ids in, text out, incrementally, with stop strings.

Decoding a growing token list one id at a time is not `decode(id)` per id: a character can span
tokens and a leading space can depend on the token before. So each step decodes a short window
(from `prefix` on) and emits only the new, complete text. Text that could be the start of a stop
string is held back until it is known not to be; once a stop string appears, the text ends just
before it. This module does not decide when generation ends (the engine does).
"""

from __future__ import annotations

from collections.abc import Sequence

from specwise.backends.base import Tokenizer

__all__ = ["Detokenizer", "pieces"]


class Detokenizer:
    def __init__(
        self, tokenizer: Tokenizer, stop: Sequence[str] = (), prompt_tail: Sequence[int] = ()
    ) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._ids: list[int] = list(prompt_tail)  # context window for the first tokens
        self._prefix = 0
        self._read = len(self._ids)
        self._text = ""  # everything decoded so far (cut at a stop string)
        self._sent = 0  # chars already handed out by `take`
        self.stopped = False

    @property
    def text(self) -> str:
        return self._text

    def push(self, token_id: int) -> bool:
        """Add one token; return True when a stop string has now appeared."""
        if self.stopped:
            return True
        self._ids.append(int(token_id))
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return False  # an incomplete character: wait for the next token
        old = len(self._text)
        self._text += after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        if self._stop:
            longest = max(map(len, self._stop))
            window_start = max(0, old - longest + 1)
            hits = [i for s in self._stop if (i := self._text.find(s, window_start)) >= 0]
            if hits:
                self._text = self._text[: min(hits)]
                self.stopped = True
        return self.stopped

    def _held(self) -> int:
        """Length of the text's tail that could still grow into a stop string."""
        if self.stopped or not self._stop:
            return 0
        held = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self._text)), held, -1):
                if self._text.endswith(s[:n]):
                    held = n
                    break
        return held

    def flush(self) -> None:
        """Generation is over: decode what is still pending (an incomplete character becomes
        the replacement character)."""
        if not self.stopped and self._read < len(self._ids):
            before = self._tok.decode(self._ids[self._prefix : self._read])
            self._text += self._tok.decode(self._ids[self._prefix :])[len(before) :]
            self._prefix = self._read = len(self._ids)

    def take(self, final: bool = False) -> str:
        """The text not handed out yet that is safe to show; with `final`, all of it."""
        if final:
            self.flush()
        end = len(self._text) if final else len(self._text) - self._held()
        if end <= self._sent:
            return ""
        out = self._text[self._sent : end]
        self._sent = end
        return out


def pieces(tokenizer: Tokenizer, tokens: Sequence[int], before: Sequence[int] = ()) -> list[str]:
    """The text each token adds after `before` (the ids preceding them), one string per token:
    "" for a token that only begins a character, the next token's piece then holding it whole.
    The pieces joined are the tokens' text, stop strings not cut."""
    d = Detokenizer(tokenizer, (), list(before)[-4:])
    out: list[str] = []
    for t in tokens:
        n = len(d.text)
        d.push(t)
        out.append(d.text[n:])
    return out
