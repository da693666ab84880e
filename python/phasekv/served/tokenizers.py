"""A small tokenizer protocol and adapters for the tokenizers served models use.

The protocol (``Tokenizer``) is what placement needs and nothing more:

    encode(text) -> list[int]     the ids of `text` with no special tokens added
    decode(ids)  -> str           the text of ids (special tokens dropped)
    bos_id, eos_id                the ids of the begin/end-of-sequence tokens, or None
    vocab_size                    ids are in [0, vocab_size)
    name                          what the tokenizer is (goes into the sweep's configuration)

Adapters: sentencepiece (``SentencePieceTokenizer``), Hugging Face ``tokenizers``
(``HFTokenizersTokenizer``), ``transformers`` (``TransformersTokenizer``) and ``tiktoken``
(``TiktokenTokenizer``). Each imports its package only when built; a missing package is a
``MissingPackageError`` naming the package and how to install it. ``load_tokenizer(spec)`` picks
the adapter from a path or a ``kind:`` prefix.
"""

from __future__ import annotations

import importlib
import os
import pathlib
from typing import Any, Protocol, Sequence, runtime_checkable

from .errors import MissingPackageError, ServedInputError


@runtime_checkable
class Tokenizer(Protocol):
    name: str

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def _require(module: str, package: str, install: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingPackageError(f"the {package!r} package is needed for this tokenizer but is not installed "
                                  f"({install}): {e}") from None


def _checked_ids(ids: Sequence[int], vocab_size: int, what: str) -> list[int]:
    out = [int(i) for i in ids]
    for i in out:
        if not 0 <= i < vocab_size:
            raise ServedInputError(f"{what}: token id {i} is outside the vocabulary [0, {vocab_size})")
    return out


class SentencePieceTokenizer:
    """A sentencepiece model (Debian: python3-sentencepiece; pip: sentencepiece), from a .model
    file or the serialized model proto (what the trainer's model_writer gives)."""

    def __init__(self, model: str | os.PathLike | bytes, *, name: str | None = None):
        spm = _require("sentencepiece", "sentencepiece", "apt-get install python3-sentencepiece, or pip install sentencepiece")
        if isinstance(model, (bytes, bytearray)):
            self._sp = spm.SentencePieceProcessor(model_proto=bytes(model))
            self.name = name or "sentencepiece:<proto>"
        else:
            path = pathlib.Path(model)
            if not path.is_file():
                raise ServedInputError(f"tokenizer = {str(path)!r}: no such sentencepiece model file")
            self._sp = spm.SentencePieceProcessor(model_file=str(path))
            self.name = name or f"sentencepiece:{path.name}"

    @property
    def bos_id(self) -> int | None:
        i = self._sp.bos_id()
        return None if i < 0 else int(i)

    @property
    def eos_id(self) -> int | None:
        i = self._sp.eos_id()
        return None if i < 0 else int(i)

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._sp.encode(text, out_type=int)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode(_checked_ids(ids, self.vocab_size, "decode"))

    def piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))


class HFTokenizersTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer.json (pip install tokenizers). BOS/EOS are looked
    up by the usual names unless given."""

    def __init__(self, path: str | os.PathLike, *, bos: str | None = None, eos: str | None = None):
        tk = _require("tokenizers", "tokenizers", "pip install tokenizers")
        self._tok = tk.Tokenizer.from_file(str(path))
        self.name = f"tokenizers:{pathlib.Path(path).name}"
        self._bos = self._find(bos, ("<s>", "<|begin_of_text|>", "<bos>", "<｜begin▁of▁sentence｜>"))
        self._eos = self._find(eos, ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "<｜end▁of▁sentence｜>"))

    def _find(self, given: str | None, names: Sequence[str]) -> int | None:
        for n in ([given] if given else names):
            i = self._tok.token_to_id(n)
            if i is not None:
                return int(i)
        if given:
            raise ServedInputError(f"special token {given!r}: not in the tokenizer's vocabulary")
        return None

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(_checked_ids(ids, self.vocab_size, "decode"), skip_special_tokens=True)


class TransformersTokenizer:
    """A ``transformers`` AutoTokenizer from a local directory (pip install transformers); no
    download: local_files_only. Its chat template, if any, is available as ``apply_chat_template``."""

    def __init__(self, path: str | os.PathLike):
        tr = _require("transformers", "transformers", "pip install transformers")
        self._tok = tr.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = f"transformers:{pathlib.Path(path).name}"

    @property
    def bos_id(self) -> int | None:
        return self._tok.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self._tok.eos_token_id

    @property
    def vocab_size(self) -> int:
        return int(len(self._tok))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(_checked_ids(ids, self.vocab_size, "decode"), skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return list(self._tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))


class TiktokenTokenizer:
    """A tiktoken encoding by name (pip install tiktoken; its BPE files must already be cached:
    nothing is downloaded here). tiktoken encodings have no BOS."""

    def __init__(self, encoding: str):
        tt = _require("tiktoken", "tiktoken", "pip install tiktoken")
        self._enc = tt.get_encoding(encoding)
        self.name = f"tiktoken:{encoding}"

    @property
    def bos_id(self) -> int | None:
        return None

    @property
    def eos_id(self) -> int | None:
        return getattr(self._enc, "eot_token", None)

    @property
    def vocab_size(self) -> int:
        return int(self._enc.n_vocab)

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(_checked_ids(ids, self.vocab_size, "decode"))


def load_tokenizer(spec: str) -> Tokenizer:
    """A tokenizer from `spec`: ``sentencepiece:PATH`` / a ``.model`` file, ``tokenizers:PATH`` / a
    tokenizer.json, ``transformers:DIR`` / a directory, ``tiktoken:NAME``."""
    kind, _, rest = spec.partition(":")
    if rest and kind in ("sentencepiece", "tokenizers", "transformers", "tiktoken"):
        target = rest
    else:
        kind, target = "", spec
    if not kind:
        path = pathlib.Path(target)
        if path.is_dir():
            kind = "transformers"
        elif path.suffix == ".json":
            kind = "tokenizers"
        elif path.suffix == ".model":
            kind = "sentencepiece"
        elif not path.exists():
            raise ServedInputError(f"tokenizer = {spec!r}: no such file or directory (or give kind:NAME, e.g. "
                                   "tiktoken:cl100k_base)")
        else:
            raise ServedInputError(f"tokenizer = {spec!r}: cannot tell its kind from the name (give "
                                   "sentencepiece:PATH, tokenizers:PATH, transformers:DIR or tiktoken:NAME)")
    if kind == "sentencepiece":
        return SentencePieceTokenizer(target)
    if kind == "tokenizers":
        return HFTokenizersTokenizer(target)
    if kind == "transformers":
        return TransformersTokenizer(target)
    return TiktokenTokenizer(target)
