"""Tokenizer, chat template and incremental detokenization with stop strings (transformers / tokenizers)."""

from __future__ import annotations

from pathlib import Path

from spectune.core.json_types import JsonObject


class Tokenizer:
    """A Hugging Face tokenizer with the chat template of the model folder.

    Args:
        folder: a folder holding tokenizer.json / tokenizer_config.json (what ``save_pretrained`` writes).
    """

    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(str(folder))
        self.backend = self.hf.backend_tokenizer
        eos = self.hf.eos_token_id
        self.eos_token_ids: list[int] = [] if eos is None else [int(eos)]

    def encode_chat(self, messages: list[JsonObject]) -> list[int]:
        """Apply the chat template with the assistant generation prompt; returns token ids.

        Raises:
            ValueError: the template cannot render these messages.
        """
        try:
            ids = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        except Exception as err:  # jinja errors from user-supplied messages
            raise ValueError(f"chat template failed on these messages: {err}") from None
        return list(ids)

    def encode(self, text: str) -> list[int]:
        """Tokenize a plain prompt (for /v1/completions), with the model's special-token convention."""
        return list(self.hf.encode(text))

    def decode(self, ids: list[int]) -> str:
        """Token ids -> text, special tokens skipped."""
        return self.hf.decode(ids, skip_special_tokens=True)


class IncrementalText:
    """Streams text for a growing list of tokens, ending at stop strings.

    Uses tokenizers' ``DecodeStream`` (correct across multi-byte characters split over tokens). Text that could be
    the start of a stop string is held back until it is ruled out, so a stop string is never streamed.

    Args:
        tokenizer: the model's :class:`Tokenizer`.
        stop: stop strings (empty strings ignored).
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = tokenizer.backend
        self._stream = DecodeStream(skip_special_tokens=True)
        self.stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self._released = 0
        self.stopped = False

    def push(self, token_id: int) -> None:
        """Add one token; sets :attr:`stopped` and truncates :attr:`text` when a stop string appears."""
        piece = self._stream.step(self._backend, int(token_id))
        if not piece:
            return
        start = max(0, len(self.text) - self._hold)
        self.text += piece
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
                return

    def release(self, final: bool) -> str:
        """Text not yet returned; keeps back a possible stop-string prefix unless ``final``."""
        end = len(self.text) if (final or self.stopped or not self.stop) else max(self._released, len(self.text) - self._hold)
        out = self.text[self._released:end]
        self._released = end
        return out
