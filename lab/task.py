"""The synthetic key→value retrieval task of the lab, generated on the fly.

One sequence of T tokens is a haystack of filler tokens with `records` key→value records
(two tokens: a key, then its value) at random, non-overlapping positions, followed by the
question block: `queries` questions "Q k" (the query marker, then the key of one of the
records); every question but the last is followed by its answer v, so several answers can
be trained on per sequence while the last question ends the sequence. The model must predict
v at the position of each question's key (loss only there).

Vocabulary (ids): [0, F) filler, [F, F+K) keys, [F+K, F+K+V) values, F+K+V the query marker.

Everything is integer arithmetic on SplitMix64, so lab/host/task.hpp generates the very same
sequences from the same seed (tests/test_task_parity.py checks it token for token):

  state = seed
  next() = splitmix64(state)             (the constants of phasekv's detail::splitmix64)
  uniform(n) = next() % n                 (the modulo bias, < n / 2^64, is irrelevant here)

  order of draws for one sequence:
    1. filler: T draws, token t = uniform(F)
    2. record starts: draw p = uniform(C − 1) (C = T − 3·queries + 1 context tokens) until
       `records` starts are taken, rejecting p that overlaps a taken record (|p − p'| < 2) or,
       when a target position is forced, the target record; with a forced target the target is
       record 0 and only records − 1 starts are drawn
    3. keys: a partial Fisher–Yates shuffle of [0, K): for i in [0, records): swap(i, i + uniform(K − i))
    4. values: records draws uniform(V)
    5. queried records: a partial Fisher–Yates shuffle of [0, records) for `queries` picks,
       except that with a forced target the last question asks for record 0
"""

from dataclasses import dataclass

import numpy as np

MASK64 = (1 << 64) - 1


GAMMA = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class SplitMix64:
    """Sequential SplitMix64. Draw i (from 0) of a generator seeded with s is
    mix64(s + (i + 1)·γ mod 2^64), so a run of draws can also be computed at once (bulk)."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + GAMMA) & MASK64
        return mix64(self.state)

    def uniform(self, n):
        return self.next() % n

    def bulk_uniform(self, count, n):
        """The next `count` draws of uniform(n), as a numpy array (vectorised)."""
        i = np.arange(1, count + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = np.uint64(self.state) + i * np.uint64(GAMMA)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        self.state = (self.state + count * GAMMA) & MASK64
        return (z % np.uint64(n)).astype(np.int64)


@dataclass(frozen=True)
class TaskConfig:
    filler: int = 16       # F
    keys: int = 64         # K
    values: int = 64       # V
    tokens: int = 512      # T
    records: int = 16
    queries: int = 4

    @property
    def vocab(self):
        return self.filler + self.keys + self.values + 1

    @property
    def query_token(self):
        return self.filler + self.keys + self.values

    @property
    def context(self):
        """Tokens before the question block (the records live in [0, context))."""
        return self.tokens - 3 * self.queries + 1

    def validate(self):
        for name in ("filler", "keys", "values", "tokens", "records", "queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name} must be at least 1, got {getattr(self, name)}")
        if self.records > self.keys:
            raise ValueError(f"task.records ({self.records}) must be at most task.keys ({self.keys}): keys are distinct")
        if self.queries > self.records:
            raise ValueError(f"task.queries ({self.queries}) must be at most task.records ({self.records})")
        if 4 * self.records > self.context:
            raise ValueError(f"task.records ({self.records}) needs at least 4 context tokens each; "
                             f"the context has {self.context}")

    def with_(self, **changes):
        d = self.__dict__.copy()
        d.update(changes)
        return TaskConfig(**d)


def generate(cfg: TaskConfig, seed: int, target: int = -1):
    """One sequence: (tokens, answer_positions, answers, record_starts, queried_records).

    answer_positions[i] is the position of question i's key (where the loss reads the logits),
    answers[i] the value token expected there. With target >= 0 the last question asks for a
    record whose key sits at position `target` (the phase sweep's placement).
    """
    rng = SplitMix64(seed)
    T, C = cfg.tokens, cfg.context
    tokens = rng.bulk_uniform(T, cfg.filler).tolist()
    starts = []
    if target >= 0:
        if target > C - 2:
            raise ValueError(f"target {target} does not leave room for its value before the questions (context {C})")
        starts.append(target)
    while len(starts) < cfg.records:
        p = rng.uniform(C - 1)
        if all(abs(p - q) >= 2 for q in starts):
            starts.append(p)
    perm = list(range(cfg.keys))
    for i in range(cfg.records):
        k = i + rng.uniform(cfg.keys - i)
        perm[i], perm[k] = perm[k], perm[i]
    values = [rng.uniform(cfg.values) for _ in range(cfg.records)]
    for r, p in enumerate(starts):
        tokens[p] = cfg.filler + perm[r]
        tokens[p + 1] = cfg.filler + cfg.keys + values[r]
    order = list(range(cfg.records))
    for i in range(cfg.queries):
        k = i + rng.uniform(cfg.records - i)
        order[i], order[k] = order[k], order[i]
    asked = order[:cfg.queries]
    if target >= 0 and 0 in asked:
        # record 0 is the target: move it to the last question
        asked.remove(0)
        asked.append(0)
    elif target >= 0:
        asked[-1] = 0
    positions, answers = [], []
    at = C
    for i, r in enumerate(asked):
        tokens[at] = cfg.query_token
        tokens[at + 1] = cfg.filler + perm[r]
        positions.append(at + 1)
        answers.append(cfg.filler + cfg.keys + values[r])
        if i + 1 < len(asked):
            tokens[at + 2] = answers[-1]
        at += 3
    assert at - 1 == T, (at, T)
    return tokens, positions, answers, starts, asked
