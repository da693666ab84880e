"""Sentencepiece models trained here, in memory, for phasekv.served's tests (no files, no
downloads): BPE and unigram, with and without byte fallback, on a small corpus of the words the
needle template uses, numbers and a little code."""

import functools
import io
import random

from phasekv.served import SentencePieceTokenizer
from phasekv.served import placement

KINDS = [("bpe", True), ("bpe", False), ("unigram", True), ("unigram", False)]


def corpus(seed=0, sentences=6000):
    rng = random.Random(seed)
    words = (list(placement.FILLER_WORDS) + list(placement.KEY_WORDS) + list(placement.VALUE_WORDS)
             + ["Question:", "value", "def", "return", "print", "stride", "tokens", "#", "-", "=", "#", "-", "="])
    lines = []
    for _ in range(sentences):
        line = " ".join(rng.choice(words) for _ in range(rng.randrange(6, 16)))
        lines.append(line + " " + str(rng.randrange(10, 1000)) + rng.choice(["", ".", ",", ":", "?"]))
    lines += ["def blocks(tokens, stride):", "    return tokens // stride", "print(blocks(32, 4))  # prints 8"] * 20
    return lines


@functools.lru_cache(maxsize=None)
def model_proto(kind, byte_fallback, vocab_size=1500):
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=out, vocab_size=vocab_size,
                                   model_type=kind, byte_fallback=byte_fallback, minloglevel=2,
                                   character_coverage=1.0, num_threads=1, hard_vocab_limit=False)
    return out.getvalue()


def tokenizer(kind="bpe", byte_fallback=True):
    return SentencePieceTokenizer(model_proto(kind, byte_fallback), name=f"sp-{kind}-{'bytes' if byte_fallback else 'nobytes'}")
