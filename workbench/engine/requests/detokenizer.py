"""Incremental detokenization and stop-string matching for one sequence.

Text grows one token at a time by decoding a short window of recent tokens and keeping only what
the new token added (the prefix/read offsets of HF's text streamer and vLLM): a token that ends
in the middle of a UTF-8 character adds nothing until the character is complete, so the text
never carries a broken character. Stop strings are searched in the newly added text (plus the
tail that could start one); a match truncates the text, and `include_stop_str_in_output` keeps
the stop string itself. While streaming, the last `len(longest stop) - 1` characters are held
back, so text that later turns out to start a stop string is never sent.
"""

from __future__ import annotations

from workbench.sampling_params import SamplingParams

_INITIAL_WINDOW = 5  # tokens of context decoded before the new ones, for spacing


class IncrementalDetokenizer:
    """Text of a sequence's output tokens, grown token by token."""

    def __init__(self, tokenizer, params: SamplingParams, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.params = params
        self.ids: list[int] = list(prompt_ids[-_INITIAL_WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.sent = 0  # characters of `text` already handed out as deltas
        stops = params.stop
        assert isinstance(stops, list)  # SamplingParams.__post_init__ makes `stop` a list
        self.stops: list[str] = stops
        self.stop_hold = max((len(s) for s in stops), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        p = self.params
        if p.skip_special_tokens or not p.spaces_between_special_tokens:
            return self._decode_plain(ids)
        # like a slow tokenizer: each special token is its own piece, pieces joined by spaces
        special = set(self.tokenizer.all_special_ids)
        pieces: list[str] = []
        run: list[int] = []
        for t in ids:
            if t in special:
                if run:
                    pieces.append(self._decode_plain(run))
                    run = []
                pieces.append(self._decode_plain([t]))
            else:
                run.append(t)
        if run:
            pieces.append(self._decode_plain(run))
        return " ".join(pieces)

    def _decode_plain(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int, check_stops: bool = True) -> str | None:
        """Appends a token; returns the matched stop string, if the text now contains one."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return self._append(new, check_stops)
        return None

    def _append(self, new: str, check_stops: bool) -> str | None:
        start = max(len(self.text) - self.stop_hold, 0)
        self.text += new
        if not check_stops:
            return None
        for stop in self.stops:
            at = self.text.find(stop, start)
            if at != -1:
                end = at + len(stop) if self.params.include_stop_str_in_output else at
                self.text = self.text[:end]
                self.sent = min(self.sent, len(self.text))
                return stop
        return None

    def flush(self) -> None:
        """At the end, keeps whatever a trailing incomplete character decodes to."""
        full = self._decode(self.ids[self.prefix_offset:])
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        if len(full) > len(prefix):
            self.text += full[len(prefix):]
            self.prefix_offset = self.read_offset = len(self.ids)

    def delta(self, finished: bool) -> str:
        """Text not handed out yet; holds back a possible stop-string start unless finished."""
        end = len(self.text) if finished else max(len(self.text) - self.stop_hold, self.sent)
        out = self.text[self.sent:end]
        self.sent = end
        return out

    def visible(self, finished: bool) -> str:
        """All text safe to show now (cumulative outputs)."""
        end = len(self.text) if finished else max(len(self.text) - self.stop_hold, 0)
        return self.text[:end]
