"""Incremental detokenization with stop strings, never emitting broken UTF-8.

The approach is vLLM's ``detokenize_incrementally`` expressed with ``decode``: keep two offsets
into the token ids, ``prefix_offset`` (where the decoding window starts, a few tokens of
context so that decoders which strip or merge at the start of a text behave as in a full
decode) and ``read_offset`` (where the text already emitted ends). Each update decodes
``ids[prefix_offset:read_offset]`` and ``ids[prefix_offset:]``; the difference is the new text.
When that text ends in U+FFFD (a multi-byte character cut in the middle by a token boundary),
the cut character is held back until a later token completes it; the text before it goes out.
"""

from __future__ import annotations

from typing import Any

from engine.sampling_params import SamplingParams

# Prompt tokens kept as decoding context for the first output tokens (vLLM uses 5 too).
_NUM_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Builds a request's ``output_text`` token by token and finds its stop strings.

    ``tokenizer`` needs ``decode(ids, skip_special_tokens=...)``. ``output_text`` only grows,
    except when a stop string truncates it. The stop token (EOS or a stop token id) should not
    be passed to ``update`` when its text must stay out of the output (vLLM's behaviour).
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams):
        self.tokenizer = tokenizer
        self.params = params
        self.skip_special_tokens = params.skip_special_tokens
        self.output_text = ""
        self.num_output_tokens = 0
        context = list(prompt_token_ids[-_NUM_CONTEXT_TOKENS:])
        self._token_ids = context
        self._prefix_offset = 0
        # Characters emitted past ``_read_offset`` while the window ends in a cut character.
        self._num_window_chars = 0
        self._read_offset = len(context)
        context_text = self._decode(context)
        if context_text.endswith(_REPLACEMENT_CHAR):
            # The prompt ends inside a multi-byte character, which the output will complete:
            # the tokens holding its first bytes go back into the window still to be read, and
            # the complete text they also hold counts as emitted (it is the prompt's).
            while self._read_offset > 0 and self._decode(context[: self._read_offset]).endswith(
                _REPLACEMENT_CHAR
            ):
                self._read_offset -= 1
            num_complete = len(context_text.rstrip(_REPLACEMENT_CHAR))
            num_read = len(self._decode(context[: self._read_offset]))
            self._num_window_chars = max(0, num_complete - num_read)
        self._token_text_cache: dict[int, str] = {}

    def update(self, new_token_ids: list[int], check_stop: bool = True) -> str | None:
        """Append ``new_token_ids`` and extend ``output_text``.

        If ``check_stop`` and a stop string of ``params.stop`` now appears in ``output_text``
        (also across token boundaries), cuts ``output_text`` at the match that starts first
        (the shorter one on a tie), keeping the stop string only with
        ``include_stop_str_in_output``, and returns that stop string; else returns None. The
        caller decides when stop strings count (``check_stop=False`` before ``min_tokens``).
        """
        if not new_token_ids:
            return None
        num_chars_before = len(self.output_text)
        for token_id in new_token_ids:
            self._token_ids.append(token_id)
            self.output_text += self._next_text()
        self.num_output_tokens += len(new_token_ids)
        if not check_stop or not self.params.stop:
            return None
        return self._check_stop_strings(num_chars_before)

    def _next_text(self) -> str:
        """Text completed by the last appended token.

        Characters still incomplete (the decode ends in U+FFFD) are held back; the complete
        text before them is emitted, counted in ``_num_window_chars`` until the window moves.
        """
        ids = self._token_ids
        prefix_text = self._decode(ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(ids[self._prefix_offset :])
        is_incomplete = new_text.endswith(_REPLACEMENT_CHAR)
        if is_incomplete:
            new_text = new_text.rstrip(_REPLACEMENT_CHAR)
        num_done = len(prefix_text) + self._num_window_chars
        delta = new_text[num_done:] if len(new_text) > num_done else ""
        if is_incomplete:
            self._num_window_chars += len(delta)
        elif len(new_text) > len(prefix_text):
            # Everything decoded is complete: the window moves on.
            self._prefix_offset = self._read_offset
            self._read_offset = len(ids)
            self._num_window_chars = 0
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _check_stop_strings(self, num_chars_before: int) -> str | None:
        """Find the earliest stop string that overlaps the text added since
        ``num_chars_before``; truncate ``output_text`` at it and return it."""
        text = self.output_text
        if len(text) == num_chars_before:
            return None
        best: tuple[int, int, str] | None = None  # (start, end, stop string)
        for stop in self.params.stop:
            # A match must end inside the new text; it may start before it (straddling).
            search_from = max(0, num_chars_before - len(stop) + 1)
            start = text.find(stop, search_from)
            if start < 0:
                continue
            candidate = (start, start + len(stop), stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        if best is None:
            return None
        start, end, stop = best
        self.output_text = text[:end] if self.params.include_stop_str_in_output else text[:start]
        return stop

    def decode_token(self, token_id: int) -> str:
        """The text of one token on its own (for logprobs display; special tokens included)."""
        text = self._token_text_cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text_cache[token_id] = text
        return text
