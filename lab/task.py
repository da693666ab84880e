"""The lab's key→value retrieval task (version 2), generated on the fly.

A sequence of T tokens is three parts:

  [ context: filler, R records, D decoys ][ questions: Q × (query marker, key) ][ u filler ]

- A **record** is a key token, g filler tokens (the gap, 0 by default), then its value token.
  Keys are distinct; values are drawn with replacement.
- A **decoy** is a lone value token in the filler (never inside a record). Decoys defeat the
  shortcut "copy some value seen in the context": without them every value in the context is
  an answer, and guessing among them scores 1/R on the first question and more on later ones.
- **Questions**: Q distinct records, each asked once as "Q k"; the model must predict the value
  at the position of the question's key (the loss reads only there). No answer is echoed, so no
  question tells the model which values are spent.
- **u trailing filler tokens**, u uniform in [0, trail]: the questions end at T − 1 − u, so the
  last question's position (the sweep's query) varies and with it the query's phase and the
  target's distance modulo any stride.

Placement of the records (`placement`):
  uniform   anywhere in the context (records and decoys never overlap);
  aligned   every record lies inside one block of the geometry (block_stride, block_origin):
            never cut by a block boundary;
  isolated  uniform, but no other record or decoy within `isolation` tokens of the target
            record (only with a forced target: the sweep's placement);
  gapped    = uniform with gap g > 0 (kept as a name for the value-at-key + g placements; with
            block_stride set, each record also lies inside one block).

Floors (what guessing scores without retrieving): `floors(cfg, seq)` gives, for the question
asked last, 1/(distinct values anywhere in the context) — the "copy some value" shortcut — and
1/(distinct values of the records) — the "copy a value that follows a key" shortcut, which needs
a previous-token feature but no key match. The lab reports both next to every accuracy.

Vocabulary (ids): [0, F) filler, [F, F+K) keys, [F+K, F+K+V) values, F+K+V the query marker.

Everything is integer arithmetic on SplitMix64, so lab/host/lab_task.hpp generates the same
sequences from the same seed (lab/tests check it token for token). Order of draws:

  state = seed;  next() = splitmix64(state);  uniform(n) = next() % n
  1. u = uniform(trail + 1)
  2. filler: T draws, token t = uniform(F)
  3. record starts, L = g + 2 tokens each, C = T − 2Q − u context tokens: with a forced target,
     the target is record 0; then p = uniform(C − L + 1) until R starts are taken, rejecting a p
     whose record overlaps a taken one, that crosses a block boundary (aligned, or gapped with
     block_stride), or that comes within `isolation` of the target (isolated); at most 10^6
     draws, then ValueError
  4. keys: a partial Fisher–Yates shuffle of [0, K): for i in [0, R): swap(i, i + uniform(K − i))
  5. values: R draws uniform(V)
  6. decoys: D times: p = uniform(C) until p is in no record, is not a decoy yet and (isolated)
     not within `isolation` of the target; then its value uniform(V)
  7. questions: a partial Fisher–Yates shuffle of [0, R) for Q picks; with a forced target the
     last question asks for record 0 (moved there if picked, else it replaces the last pick)
"""

from dataclasses import dataclass, asdict

import numpy as np

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
PLACEMENTS = ("uniform", "aligned", "isolated", "gapped")
MAX_DRAWS = 1_000_000


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
    filler: int = 16        # F
    keys: int = 64          # K
    values: int = 64        # V
    tokens: int = 256       # T
    records: int = 8        # R
    queries: int = 8        # Q ≤ R
    decoys: int = 8         # D
    trail: int = 15         # u ∈ [0, trail]
    gap: int = 0            # g
    placement: str = "uniform"
    block_stride: int = 0   # the blocks of aligned / gapped placements (0: none)
    block_origin: int = 0
    isolation: int = 0      # isolated: no other record or decoy this close to the target

    @property
    def vocab(self):
        return self.filler + self.keys + self.values + 1

    @property
    def query_token(self):
        return self.filler + self.keys + self.values

    @property
    def record_tokens(self):
        return self.gap + 2

    def context(self, u):
        """Tokens before the questions when the trailing filler is u tokens."""
        return self.tokens - 2 * self.queries - u

    @property
    def min_context(self):
        return self.context(self.trail)

    def validate(self):
        for name in ("filler", "keys", "values", "tokens", "records", "queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("decoys", "trail", "gap", "block_stride", "block_origin", "isolation"):
            if getattr(self, name) < 0:
                raise ValueError(f"task.{name} must be at least 0, got {getattr(self, name)}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"task.placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.records > self.keys:
            raise ValueError(f"task.records ({self.records}) must be at most task.keys ({self.keys}): keys are distinct")
        if self.queries > self.records:
            raise ValueError(f"task.queries ({self.queries}) must be at most task.records ({self.records})")
        if self.placement == "aligned" and self.block_stride < self.record_tokens:
            raise ValueError(f"task.block_stride ({self.block_stride}) must hold a whole record of "
                             f"{self.record_tokens} tokens for placement 'aligned'")
        if self.block_stride and self.block_origin >= self.block_stride:
            raise ValueError(f"task.block_origin ({self.block_origin}) must be below task.block_stride ({self.block_stride})")
        if self.placement == "gapped" and self.gap < 1:
            raise ValueError("task.gap must be at least 1 for placement 'gapped'")
        need = 2 * self.records * self.record_tokens + 2 * self.decoys
        if need > self.min_context:
            raise ValueError(f"task: {self.records} records of {self.record_tokens} tokens and {self.decoys} decoys "
                             f"need at least {need} context tokens (at twice their size); the context has "
                             f"{self.min_context} at the longest trailing filler")

    def with_(self, **changes):
        d = asdict(self)
        d.update(changes)
        return TaskConfig(**d)

    def to_dict(self):
        return asdict(self)


@dataclass
class Sequence:
    tokens: list
    answer_positions: list   # the position of each question's key (where the loss reads)
    answers: list            # the value token expected there
    record_starts: list      # key position of each record (record 0 = the target when forced)
    asked: list              # the record each question asks for
    decoys: list             # decoy positions
    trail: int               # u

    @property
    def query_position(self):
        return self.answer_positions[-1]


def in_one_block(cfg, p):
    """Whether tokens [p, p + L) lie in one block of (block_stride, block_origin)."""
    S = cfg.block_stride
    lead = (S - cfg.block_origin) % S
    return (p + lead) // S == (p + cfg.record_tokens - 1 + lead) // S


def generate(cfg: TaskConfig, seed: int, target: int = -1, trail: int = -1):
    """One sequence (a Sequence). With target ≥ 0 the last question asks for a record whose key
    is at `target` (the sweep's placement); with trail ≥ 0 the trailing filler is that long
    instead of drawn (the draw still happens, so the rest is the sequence the seed gives)."""
    rng = SplitMix64(seed)
    T, L = cfg.tokens, cfg.record_tokens
    u = rng.uniform(cfg.trail + 1)
    if trail >= 0:
        u = trail
    C = cfg.context(u)
    tokens = rng.bulk_uniform(T, cfg.filler).tolist()
    blocks = cfg.placement == "aligned" or (cfg.placement == "gapped" and cfg.block_stride > 0)
    isolated = cfg.placement == "isolated" and target >= 0
    starts = []
    if target >= 0:
        if target > C - L:
            raise ValueError(f"target {target} does not leave room for its record before the questions (context {C})")
        starts.append(target)

    def near_target(lo, hi):  # tokens [lo, hi) within `isolation` of the target record
        return isolated and lo < target + L + cfg.isolation and hi > target - cfg.isolation

    draws = 0
    while len(starts) < cfg.records:
        draws += 1
        if draws > MAX_DRAWS:
            raise ValueError(f"task: could not place {cfg.records} records ({cfg.placement}) in {C} tokens")
        p = rng.uniform(C - L + 1)
        if any(abs(p - q) < L for q in starts):
            continue
        if blocks and not in_one_block(cfg, p):
            continue
        if near_target(p, p + L):
            continue
        starts.append(p)
    perm = list(range(cfg.keys))
    for i in range(cfg.records):
        k = i + rng.uniform(cfg.keys - i)
        perm[i], perm[k] = perm[k], perm[i]
    values = [rng.uniform(cfg.values) for _ in range(cfg.records)]
    taken = set()
    for r, p in enumerate(starts):
        taken.update(range(p, p + L))
        tokens[p] = cfg.filler + perm[r]
        tokens[p + L - 1] = cfg.filler + cfg.keys + values[r]
    decoys = []
    draws = 0
    while len(decoys) < cfg.decoys:
        draws += 1
        if draws > MAX_DRAWS:
            raise ValueError(f"task: could not place {cfg.decoys} decoys in {C} tokens")
        p = rng.uniform(C)
        if p in taken or near_target(p, p + 1):
            continue
        taken.add(p)
        decoys.append(p)
        tokens[p] = cfg.filler + cfg.keys + rng.uniform(cfg.values)
    order = list(range(cfg.records))
    for i in range(cfg.queries):
        k = i + rng.uniform(cfg.records - i)
        order[i], order[k] = order[k], order[i]
    asked = order[:cfg.queries]
    if target >= 0:
        if 0 in asked:
            asked.remove(0)
            asked.append(0)
        else:
            asked[-1] = 0
    positions, answers = [], []
    for i, r in enumerate(asked):
        at = C + 2 * i
        tokens[at] = cfg.query_token
        tokens[at + 1] = cfg.filler + perm[r]
        positions.append(at + 1)
        answers.append(cfg.filler + cfg.keys + values[r])
    return Sequence(tokens, positions, answers, starts, asked, decoys, u)


def floors(cfg: TaskConfig, seq: Sequence):
    """(any_value, record_value): the chance of the last question's answer under the two
    guessing shortcuts (see the module docstring)."""
    first_value = cfg.filler + cfg.keys
    C = cfg.context(seq.trail)
    in_context = {t for t in seq.tokens[:C] if first_value <= t < first_value + cfg.values}
    of_records = {seq.tokens[p + cfg.record_tokens - 1] for p in seq.record_starts}
    return 1.0 / len(in_context), 1.0 / len(of_records)
