"""SmolLM2's tokenizer, loaded from local files only.

The tokenizer ships twice: inside the GGUF (which only the CPU machine has) and as a small
committed copy in `engine/assets/tokenizer/` (written by `python -m engine.weights
--export-tokenizer`). Loading from a directory with `local_files_only=True` means no code path
here can ever reach the Hugging Face hub.

SmolLM2 uses a GPT-2 style byte-level BPE: every token is a sequence of *bytes*, shown in the
vocabulary through GPT-2's byte-to-unicode table (a leading space appears as "Ġ"). A single
token can therefore be half of a UTF-8 character, which is why `decode_token` works on bytes.
The vocabulary lacks 21 byte tokens (e.g. 0xF1, the UTF-8 lead byte of U+40000..U+7FFFF, and a
few ASCII control codes); the model's own tokenizer silently drops such bytes, and so do we.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

ASSETS_DIR = Path(__file__).resolve().parent / "assets" / "tokenizer"

# ChatML: a turn is "<|im_start|>{role}\n{content}<|im_end|>\n". The assistant ends its turn with
# <|im_end|>; <|endoftext|> ends a document in pre-training and is kept as a stop token too so a
# stray one never leaks into the output.
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"

# How `decode_token` makes invisible characters visible in a token strip.
_VISIBLE = {" ": "\u2423", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode`: vocabulary character -> raw byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class Tokenizer:
    """Thin, typed wrapper over a Hugging Face fast tokenizer loaded from a local directory."""

    def __init__(self, path: str | Path = ASSETS_DIR) -> None:
        # Imported lazily: transformers costs ~1 s to import and the app may not need it yet.
        from transformers import AutoTokenizer

        self.path = Path(path)
        if not (self.path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in {self.path}")
        self._tok = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        if not self._tok.chat_template:
            raise ValueError(f"tokenizer in {self.path} has no chat template")
        self.vocab_size: int = len(self._tok)
        self.bos_token_id: int = self._id(IM_START)
        # Stop tokens: the end of an assistant turn first, then end-of-document.
        self.eos_token_ids: tuple[int, ...] = (self._id(IM_END), self._id(END_OF_TEXT))
        self._special_ids: frozenset[int] = frozenset(self._tok.all_special_ids) | frozenset(
            self._tok.added_tokens_decoder
        )
        # decode_token's answers: every emitted token of every request asks, so at a few hundred
        # requests per step the byte-level decoding would cost milliseconds a step uncached.
        self._display: dict[int, str] = {}

    def _id(self, token: str) -> int:
        tid = self._tok.convert_tokens_to_ids(token)
        if not isinstance(tid, int) or (tid == self._tok.unk_token_id and token != END_OF_TEXT):
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return tid

    @property
    def chat_template(self) -> str:
        return str(self._tok.chat_template)

    def encode(self, text: str) -> list[int]:
        """Token ids for `text`. No BOS is added: SmolLM2 does not use one outside ChatML."""
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (special tokens: their UTF-8 text)."""
        piece = self._tok.convert_ids_to_tokens(int(token_id))
        if token_id in self._special_ids:
            return piece.encode("utf-8")
        table = _byte_decoder()
        return bytes(table[ch] for ch in piece)

    def decode_token(self, token_id: int) -> str:
        """One token as display text: spaces/newlines/tabs made visible, and bytes that are only
        part of a UTF-8 character shown as <0xNN> instead of a replacement character."""
        text = self._display.get(token_id)
        if text is None:
            text = self._display[token_id] = self._display_text(token_id)
        return text

    def _display_text(self, token_id: int) -> str:
        if token_id in self._special_ids:
            return self._tok.convert_ids_to_tokens(int(token_id))
        raw = self.token_bytes(token_id)
        out: list[str] = []
        i = 0
        while i < len(raw):
            # Take the longest prefix that decodes cleanly; fall back to a hex byte.
            for j in range(min(len(raw), i + 4), i, -1):
                try:
                    out.append("".join(_VISIBLE.get(c, c) for c in raw[i:j].decode("utf-8")))
                    i = j
                    break
                except UnicodeDecodeError:
                    continue
            else:
                out.append(f"<0x{raw[i]:02X}>")
                i += 1
        return "".join(out)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """ChatML ids for `messages` (SmolLM2's template adds its default system turn if none)."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text)

    def chat_prompt_ids(self, message: str) -> list[int]:
        """One user message as a ChatML prompt ready for the assistant's answer: what every page and lab sends."""
        return self.apply_chat_template([{"role": "user", "content": message}])

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The ChatML prompt as text (what `apply_chat_template` tokenises)."""
        return str(
            self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        )

    def __repr__(self) -> str:
        return f"Tokenizer(path={str(self.path)!r}, vocab_size={self.vocab_size})"


@functools.cache
def default_tokenizer() -> Tokenizer:
    """The committed copy; works on machines without the GGUF. Cached: loading costs ~0.1 s."""
    return Tokenizer(ASSETS_DIR)
