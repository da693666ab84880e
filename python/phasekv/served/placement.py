"""Needle prompts on token ids: every token's position known, every needle where the plan put it.

Positions are the model's: position 0 is the first token the model sees (its BOS, if it has one),
and the compression grid's origin (the plan's ``origin``) is stated in that frame. A prompt is

    [prefix][haystack: filler, records, decoys, the needles][question][tail]
     0 .. P-1                                                   ... q    (q = the plan's query position)

- **prefix**: BOS (when the tokenizer has one and ``bos`` is set), then a system prompt or the head
  of a chat template (as token ids the caller's template gives, or text encoded here), counted:
  P = len(prefix). Every needle must start at or after P.
- **needle** of a trial (the plan's ``layout.needle`` = [t, t + n)): a record, key tokens, then the
  connective (the plan's ``gap``), then value tokens; n = key_tokens + gap + value_tokens exactly
  (a plan whose needle_tokens differs is refused: the record shape and the needle cannot disagree).
  Every needle of the trial's haystack is placed, each with its own key; the question asks the
  trial's.
- **distractor records** (other keys, same format) at ``density`` records per token and **decoys**
  (lone values) fill the free space; keys are distinct within a haystack.
- **filler**: words that are exactly one token each (checked), so any gap is filled exactly.
- **question** + tail: the question's last token (or the tail's, e.g. a chat template's assistant
  header) is at the plan's query position q, so the answer's first token is predicted at q and
  sits at q + 1. The prompt is q + 1 tokens.

A haystack's content is a function of its seed and position only (never of the trial's query),
so trials of one haystack share their prompt up to their question: a server's prefix cache
serves them (``prompts`` yields them together).

Text prompts: tokenizers are not concatenative, so a prompt sent as text is checked by decoding
the ids and re-encoding the whole text (``verify_text``). A prompt whose re-encoding moves any
needle, the question or the length is rebuilt with other filler, keys and values around it
(``attempts`` times) and otherwise refused with the reason — never sent misplaced. Servers that take
token ids (vLLM, SGLang, llama.cpp's server) are sent the ids: nothing can move.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .errors import PlacementError, ServedInputError
from .tokenizers import Tokenizer

# Neutral filler: common words, each expected to be one token with a real tokenizer (checked;
# those that are not are dropped).
FILLER_WORDS = tuple((
    "the of and to in is was for on that with as it by at from his her an they be this are or had not but "
    "which one were all we when there can more has been if no out so what up its about into than them only "
    "other new some could time these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three"
).split())
# Key words: a key is `key_tokens` of them (so 200 words give 40,000 two-token keys).
KEY_WORDS = tuple((
    "apple river stone cloud maple tiger piano silver garden rocket candle forest island mirror copper "
    "falcon harbor jacket lemon marble needle orange pepper quartz ribbon saddle tunnel velvet walnut yellow "
    "zebra anchor basket cactus dragon engine feather glacier hammer igloo jungle kettle ladder magnet "
    "nickel oyster pencil rabbit shadow timber violet wizard bamboo canyon dolphin eagle fossil goblet "
    "hazel iron jasmine kayak lantern meadow nectar olive parrot quiver raven salmon thistle umbrella "
    "vessel willow cobalt amber beacon cedar daisy ember fern granite harp ivy juniper kite lotus mango "
    "nutmeg onyx pearl quill rose sapphire tulip urchin vine wheat yarn zinc acorn blossom coral dune "
    "elm flint grove heron indigo jade kelp lilac moss nova opal plum reef sage topaz wren badger bison "
    "camel donkey ferret gecko hippo koala lemur llama moose otter panda puma rhino sloth stork tapir "
    "walrus yak"
).split())

# Word values (values="words"): colours and materials, disjoint from the key words.
VALUE_WORDS = tuple((
    "red blue green black white brown grey pink gold purple crimson scarlet azure beige ivory khaki navy "
    "teal maroon tan cyan lime ochre plaster glass paper cotton wool leather steel brass tin clay"
).split())

VALUE_KINDS = ("numbers", "words")


@dataclasses.dataclass(frozen=True)
class RecordTemplate:
    """How records, decoys and the question read. A record is ``key`` (key words whose token
    counts sum to key_tokens) ``connective`` (the plan's gap, in tokens) ``value``; the question is
    ``question_head`` key ``question_tail``, and the answer is the value (its text with the
    leading space).

    ``values``: "numbers" (integers from ``number_range`` whose " N" is value_tokens tokens) or
    "words" (``value_words`` of value_tokens tokens, sharing no token with the keys); ``density``:
    distractor records per token (the study's 128K plan: 16000 / 131072); ``decoys``: lone values
    per distractor record."""

    connective: str = ""
    question_head: str = " Question: the value of"
    question_tail: str = " is"
    values: str = "numbers"
    number_range: tuple = (10, 100000)
    density: float = 16000 / 131072
    decoys: float = 0.5
    filler_words: tuple = FILLER_WORDS
    key_words: tuple = KEY_WORDS
    value_words: tuple = VALUE_WORDS

    def __post_init__(self) -> None:
        if self.values not in VALUE_KINDS:
            raise ServedInputError(f"values = {self.values!r}: must be one of {VALUE_KINDS}")
        if not (0.0 <= self.density < 1.0 and math.isfinite(self.density)):
            raise ServedInputError(f"density = {self.density!r}: must be in [0, 1) records per token")
        if not (0.0 <= self.decoys and math.isfinite(self.decoys)):
            raise ServedInputError(f"decoys = {self.decoys!r}: must be a non-negative number per record")
        lo, hi = self.number_range
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi):
            raise ServedInputError(f"number_range = {self.number_range!r}: must be integers 0 <= low < high")


@dataclasses.dataclass(frozen=True)
class Prefix:
    """The tokens before the haystack (BOS, system prompt or chat template head) and after the
    question (``tail``: e.g. a chat template's assistant header), as the model will see them."""

    ids: tuple
    tail: tuple = ()
    description: str = ""

    @property
    def length(self) -> int:
        return len(self.ids)


def model_prefix(tokenizer: Tokenizer, *, bos: bool = True, system: str | None = None,
                 template: Callable[[Tokenizer], tuple[Sequence[int], Sequence[int]]] | None = None) -> Prefix:
    """The prefix a server puts before the prompt: BOS (if ``bos`` and the tokenizer has one), then
    ``template(tokenizer) -> (head_ids, tail_ids)`` (a chat template applied locally: the head
    before the user's text, the tail after it) or the ``system`` text. Every id is counted."""
    ids: list[int] = []
    parts = []
    if bos:
        if tokenizer.bos_id is None:
            parts.append("no BOS (the tokenizer has none)")
        else:
            ids.append(int(tokenizer.bos_id))
            parts.append(f"BOS {tokenizer.bos_id}")
    tail: list[int] = []
    if template is not None:
        head, tail_ids = template(tokenizer)
        ids.extend(int(i) for i in head)
        tail = [int(i) for i in tail_ids]
        parts.append(f"template head {len(head)} tokens, tail {len(tail)} tokens")
    elif system:
        encoded = tokenizer.encode(system)
        ids.extend(encoded)
        parts.append(f"system prompt {len(encoded)} tokens")
    for i in ids + tail:
        if not 0 <= i < tokenizer.vocab_size:
            raise ServedInputError(f"prefix: token id {i} is outside the vocabulary [0, {tokenizer.vocab_size})")
    return Prefix(tuple(ids), tuple(tail), "; ".join(parts) or "nothing")


def chat_template(tokenizer: Tokenizer, *, system: str | None = None
                  ) -> Callable[[Tokenizer], tuple[list[int], list[int]]]:
    """The tokenizer's own chat template (``apply_chat_template(messages) -> ids``, as
    TransformersTokenizer has), applied locally, as model_prefix's `template`: the ids before and
    after the user's text, found by rendering different user texts and keeping what they all
    share at the start (head) and at the end (tail). A leading BOS is left to model_prefix."""
    apply = getattr(tokenizer, "apply_chat_template", None)
    if apply is None:
        raise ServedInputError(f"tokenizer {getattr(tokenizer, 'name', tokenizer)!r} has no chat template "
                               "(a transformers tokenizer directory has one)")
    messages = [{"role": "system", "content": system}] if system else []
    # Several user texts: a token two texts happen to share at their start (a word-start piece)
    # is content, not template, so the head is the shortest common prefix over all pairs.
    renders = [[int(i) for i in apply(messages + [{"role": "user", "content": text}])]
               for text in ("alpha", "7", "((", "Zebra omega")]
    head = tail = min(len(r) for r in renders)
    for a in renders:
        for b in renders:
            if a is b:
                continue
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            head = min(head, k)
            k = 0
            while k < min(len(a), len(b)) and a[-1 - k] == b[-1 - k]:
                k += 1
            tail = min(tail, k)
    a = renders[0]
    head_ids, tail_ids = a[:head], a[len(a) - tail:] if tail else []
    if head_ids and tokenizer.bos_id is not None and head_ids[0] == tokenizer.bos_id:
        head_ids = head_ids[1:]

    def template(_: Tokenizer) -> tuple[list[int], list[int]]:
        return head_ids, tail_ids

    return template


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A RecordTemplate resolved against a tokenizer: the ids every piece is built from."""

    filler: np.ndarray  # (F,) one-token filler words
    key_pattern: tuple  # token lengths of the words a key is made of (they sum to key_tokens)
    key_atoms: dict  # length -> (count, length) ids of key words of that many tokens
    key_atom_texts: dict  # length -> texts (" apple")
    values: np.ndarray  # (V, value_tokens) value ids
    value_texts: tuple  # (V,) " 4821"
    connective: tuple
    question_head: tuple
    question_tail: tuple

    @property
    def keyspace(self) -> int:
        return math.prod(len(self.key_atoms[n]) for n in self.key_pattern)

    def key(self, code: int) -> tuple[np.ndarray, str]:
        """Key number `code` (in [0, keyspace)): its ids and text, a mixed-radix digit per word."""
        ids, texts = [], []
        for n in self.key_pattern:
            code, d = divmod(int(code), len(self.key_atoms[n]))
            ids.append(self.key_atoms[n][d])
            texts.append(self.key_atom_texts[n][d])
        return np.concatenate(ids), "".join(texts)


def _one_token_words(tokenizer: Tokenizer, words: Iterable[str]) -> tuple[list[int], list[str]]:
    ids, texts, seen = [], [], set()
    for w in words:
        e = tokenizer.encode(" " + w)
        if len(e) == 1 and e[0] not in seen and tokenizer.decode(e).strip() == w:
            seen.add(e[0])
            ids.append(e[0])
            texts.append(" " + w)
    return ids, texts


def resolve(tokenizer: Tokenizer, template: RecordTemplate, *, key_tokens: int, gap: int,
            value_tokens: int) -> Vocabulary:
    """The template's pieces as ids, each checked to be the planned number of tokens; a template
    the tokenizer cannot represent (too few one-token words, a connective of the wrong length, no
    value of value_tokens tokens) is a PlacementError saying which."""
    name = getattr(tokenizer, "name", type(tokenizer).__name__)
    filler, _ = _one_token_words(tokenizer, template.filler_words)
    if len(filler) < 8:
        raise PlacementError(f"tokenizer {name}: only {len(filler)} of the {len(template.filler_words)} filler words "
                             "are one token (need 8): give filler_words this tokenizer has")
    # Key words of any token count; a key is the pattern of word lengths summing to key_tokens
    # that gives the most distinct keys (best[k] = max over n of count[n] · best[k − n]).
    filler_set = set(int(i) for i in filler)
    atoms: dict[int, list] = {}
    atom_texts: dict[int, list] = {}
    seen: set = set()
    for w in template.key_words:
        if w in template.filler_words:
            continue
        e = tokenizer.encode(" " + w)
        if (1 <= len(e) <= key_tokens and tuple(e) not in seen and tokenizer.decode(e).strip() == w
                and not (len(e) == 1 and e[0] in filler_set)):
            seen.add(tuple(e))
            atoms.setdefault(len(e), []).append(e)
            atom_texts.setdefault(len(e), []).append(" " + w)
    best: list = [(1, ())] + [(0, ())] * key_tokens
    for k in range(1, key_tokens + 1):
        for n, group in atoms.items():
            if n <= k and best[k - n][0] * len(group) > best[k][0]:
                best[k] = (best[k - n][0] * len(group), best[k - n][1] + (n,))
    if best[key_tokens][0] < 4:
        raise PlacementError(f"tokenizer {name}: the key words make only {best[key_tokens][0]} distinct keys of "
                             f"key_tokens = {key_tokens} tokens (need 4): give key_words this tokenizer has")
    keys_set = {i for group in atoms.values() for e in group for i in e}
    connective = tokenizer.encode(template.connective) if template.connective else []
    if len(connective) != gap:
        raise PlacementError(f"connective = {template.connective!r} is {len(connective)} tokens with {name}; the "
                             f"plan's record has gap = {gap}")
    values, value_texts = [], []
    if template.values == "numbers":
        lo, hi = template.number_range
        rng = np.random.default_rng(12345)
        span = hi - lo
        candidates = (range(lo, hi) if span <= 4000 else
                      sorted(set(int(x) for x in rng.integers(lo, hi, size=4000))))
        for n in candidates:
            e = tokenizer.encode(f" {n}")
            if len(e) == value_tokens and tokenizer.decode(e).strip() == str(n):
                values.append(e)
                value_texts.append(f" {n}")
    else:
        for w in template.value_words:
            e = tokenizer.encode(" " + w)
            if len(e) == value_tokens and not (len(e) == 1 and e[0] in keys_set):
                values.append(e)
                value_texts.append(" " + w)
        values = [v for v in values if not set(v) & keys_set] or values
    if len(values) < 2:
        raise PlacementError(f"tokenizer {name}: {len(values)} {template.values} values are {value_tokens} tokens "
                             "(need 2): change value_tokens or the values")
    head = tokenizer.encode(template.question_head) if template.question_head else []
    tail = tokenizer.encode(template.question_tail) if template.question_tail else []
    return Vocabulary(np.asarray(filler, np.int64), best[key_tokens][1],
                      {n: np.asarray(g, np.int64) for n, g in atoms.items()},
                      {n: tuple(t) for n, t in atom_texts.items()}, np.asarray(values, np.int64),
                      tuple(value_texts), tuple(connective), tuple(head), tuple(tail))


@dataclasses.dataclass(frozen=True)
class NeedlePrompt:
    """One trial's prompt: ids (the model's whole sequence, prefix included) and where things are."""

    trial_id: int
    haystack: int
    ids: np.ndarray  # int64, length = query_position + 1
    needle: tuple  # [start, end) of the trial's record
    key_span: tuple
    value_span: tuple
    question: tuple  # [start, end) of question + tail
    key_text: str
    answer: str  # the value's text, leading space included (" 4821")
    answer_ids: tuple
    prefix_length: int
    attempt: int  # 0: as planned; k: rebuilt k times for a text prompt whose seams merged

    @property
    def sha256(self) -> str:
        return hashlib.sha256(np.ascontiguousarray(self.ids, dtype="<i8").tobytes()).hexdigest()

    def id_list(self) -> list[int]:
        return self.ids.tolist()


def _trial_sections(trial: Mapping[str, Any]) -> tuple[dict, dict]:
    try:
        return dict(trial["sweep"]), dict(trial["layout"])
    except (KeyError, TypeError):
        raise ServedInputError(f"trial {trial.get('trial_id')!r}: not a plan's trial line (no sweep/layout)") from None


class NeedleBuilder:
    """Builds every trial's prompt of a plan (phasekv.sweep.Plan or its trial dicts) on a
    tokenizer. Checks the plan against the prompt's shape before anything is built
    (``check_plan``): the record, the prefix and the question must fit the plan's positions."""

    def __init__(self, tokenizer: Tokenizer, template: RecordTemplate = RecordTemplate(), prefix: Prefix | None = None,
                 *, stride: int | None = None):
        self.tokenizer = tokenizer
        self.template = template
        self.prefix = prefix if prefix is not None else model_prefix(tokenizer)
        self.stride = stride
        self._vocab: Vocabulary | None = None
        self._shape: tuple | None = None
        self._canvas_key: tuple | None = None
        self._canvas: tuple | None = None
        # Client workers build prompts from several threads: the haystack cache is one builder's.
        self._lock = threading.RLock()

    @property
    def vocabulary(self) -> Vocabulary:
        """The template resolved against the tokenizer (after check_plan or prepare)."""
        if self._vocab is None:
            raise ServedInputError("NeedleBuilder: check_plan() or prepare() first")
        return self._vocab

    @property
    def shape(self) -> tuple:
        """(key_tokens, gap, value_tokens) of the records (after check_plan or prepare)."""
        if self._shape is None:
            raise ServedInputError("NeedleBuilder: check_plan() or prepare() first")
        return self._shape

    # ---- checks ----

    def check_plan(self, trials: Sequence[Mapping[str, Any]]) -> Vocabulary:
        """Raises PlacementError/ServedInputError if the plan cannot be built as planned."""
        if not trials:
            raise ServedInputError("plan: holds no trial")
        sweep, _ = _trial_sections(trials[0])
        if self.stride is not None and sweep.get("stride") != self.stride:
            raise ServedInputError(f"plan stride = {sweep.get('stride')!r}: this measurement is for stride "
                                   f"{self.stride} (plan again with --stride {self.stride})")
        record = sweep.get("record", {"key_tokens": 1, "gap": 0, "value_tokens": 1})
        shape = (int(record["key_tokens"]), int(record["gap"]), int(record["value_tokens"]))
        if sum(shape) != sweep.get("needle_tokens"):
            raise PlacementError(f"needle_tokens = {sweep.get('needle_tokens')!r}: a record of key_tokens {shape[0]}, "
                                 f"gap {shape[1]}, value_tokens {shape[2]} is {sum(shape)} tokens; plan with "
                                 "--needle-tokens equal to the record's length")
        if self._vocab is None or self._shape != shape:
            self._vocab = resolve(self.tokenizer, self.template, key_tokens=shape[0], gap=shape[1], value_tokens=shape[2])
            self._shape = shape
        question = self.question_length()
        for t in trials:
            _, layout = _trial_sections(t)
            start, end = layout["needle"]
            q = layout["query"]
            needles = layout.get("haystack_needles", [start])
            if "content" in t:  # a paired plan: the content's own needle sits after the prefix too
                needles = list(needles) + [t["content"]["needle"][0]]
            if min(needles) < self.prefix.length:
                raise PlacementError(f"trial {t['trial_id']}: a needle at position {min(needles)} would overlap the "
                                     f"model's prefix ({self.prefix.length} tokens: {self.prefix.description}); plan "
                                     f"targets at or after {self.prefix.length}")
            if max(needles) + sum(shape) > q + 1 - question:
                raise PlacementError(f"trial {t['trial_id']}: a needle ending at {max(needles) + sum(shape)} would overlap "
                                     f"the question, which takes positions [{q + 1 - question}, {q + 1}): plan with "
                                     f"min_distance >= needle_tokens + {question}")
        return self._vocab

    def prepare(self, *, key_tokens: int, gap: int = 0, value_tokens: int) -> Vocabulary:
        """Resolves the template for a record shape without a plan (what a server-side model that
        reads these prompts needs; check_plan does the same from a plan)."""
        self._vocab = resolve(self.tokenizer, self.template, key_tokens=key_tokens, gap=gap, value_tokens=value_tokens)
        self._shape = (key_tokens, gap, value_tokens)
        return self._vocab

    def question_length(self) -> int:
        """Tokens of question + key + tail + the prefix's tail (the question ends at the query)."""
        if self._vocab is None or self._shape is None:
            raise ServedInputError("NeedleBuilder: check_plan() first")
        v = self._vocab
        return len(v.question_head) + self._shape[0] + len(v.question_tail) + len(self.prefix.tail)

    # ---- building ----

    _BLOCK = 4096

    def _haystack_canvas(self, trial: Mapping[str, Any], needles: Sequence[int], length: int, salt: int) -> tuple:
        """(ids[:length], key ids of each needle, value index of each needle) of the trial's haystack.

        Content is a function of (seed, salt, needles, position) only — never of the query — so
        trials of one haystack with different queries share every token before the earlier
        question. Positions come in blocks of 4096, each drawn from its own generator: filler
        words, then distractor records and decoys on free positions (one filler token around
        every record). Keys are distinct in the haystack: record slot j (needles first, then each
        block's records) gets key code (a·j + b) mod |keys|, a bijection (gcd(a, |keys|) = 1).
        A distractor cut by the question is replaced by its filler."""
        v = self._vocab
        kt, gap, vt = self._shape
        n = kt + gap + vt
        P = self.prefix.length
        B = self._BLOCK
        seed = int(trial.get("seed", 0)) & 0xFFFFFFFFFFFFFFFF
        ident = (trial.get("sweep_id", ""), int(trial.get("haystack", 0)), seed, tuple(needles), salt, self._shape)
        cache = self._canvas if self._canvas_key == ident else None
        keyspace = v.keyspace
        per_block = int(round(self.template.density * B))
        decoys_per_block = int(round(per_block * self.template.decoys))
        if cache is None:
            rng = np.random.default_rng([seed, salt, 0x5E12ED])
            a = int(rng.integers(1, max(2, keyspace)))
            while math.gcd(a, keyspace) != 1:
                a += 1
            b = int(rng.integers(0, keyspace))
            needle_values = rng.integers(0, len(v.values), size=len(needles))
            cache = {"ids": np.empty(0, np.int64), "plain": np.empty(0, np.int64), "spans": [], "a": a, "b": b,
                     "needle_values": needle_values, "taken": np.zeros(0, bool)}
            self._canvas_key, self._canvas = ident, cache

        def key_ids(slot: int) -> np.ndarray:
            if slot >= keyspace:
                raise PlacementError(f"haystack {ident[1]}: more records than distinct keys ({keyspace} keys of "
                                     f"key_tokens = {kt} from the key words): lower the density or raise key_tokens")
            return v.key((cache["a"] * slot + cache["b"]) % keyspace)[0]

        def record(ids: np.ndarray, at: int, slot: int, value: int) -> None:
            ids[at: at + kt] = key_ids(slot)
            ids[at + kt: at + kt + gap] = v.connective
            ids[at + kt + gap: at + n] = v.values[value]

        while len(cache["ids"]) < length:
            block = len(cache["ids"]) // B
            lo, hi = block * B, (block + 1) * B
            rng = np.random.default_rng([seed, salt, 0xB10C, block])
            plain = v.filler[rng.integers(0, len(v.filler), size=B)]
            ids = plain.copy()
            taken = np.zeros(B + n + 2, bool)
            for p in range(lo, min(hi, P)):
                taken[p - lo] = True
            for s in needles:
                if s + n + 1 > lo and s - 1 < hi:
                    taken[max(0, s - 1 - lo): max(0, min(B, s + n + 1 - lo))] = True
            starts = rng.integers(0, B - n, size=3 * (per_block + decoys_per_block) + 1)
            values = rng.integers(0, len(v.values), size=per_block + decoys_per_block)
            cursor = 0
            for k in range(per_block + decoys_per_block):
                width = n if k < per_block else vt
                while cursor < len(starts):
                    s = int(starts[cursor])
                    cursor += 1
                    if not taken[max(0, s - 1): s + width + 1].any():
                        taken[s: s + width] = True
                        if k < per_block:
                            record(ids, s, len(needles) + block * per_block + k, int(values[k]))
                        else:
                            ids[s: s + vt] = v.values[values[k]]
                        cache["spans"].append((lo + s, lo + s + width))
                        break
            cache["ids"] = np.concatenate([cache["ids"], ids])
            cache["plain"] = np.concatenate([cache["plain"], plain])
        ids = cache["ids"][:length].copy()
        ids[:P] = self.prefix.ids
        for s, e in cache["spans"]:
            if s < length < e:
                ids[s:length] = cache["plain"][s:length]
        for k, s in enumerate(needles):
            if s + n <= length:
                record(ids, s, k, int(cache["needle_values"][k]))
        codes = [(cache["a"] * k + cache["b"]) % keyspace for k in range(len(needles))]
        return ids, codes, cache["needle_values"]

    def build(self, trial: Mapping[str, Any], *, salt: int = 0) -> NeedlePrompt:
        """The prompt of one trial (check_plan must have accepted its plan). `salt` != 0 draws other
        filler, keys and values (the re-placement of a text prompt whose seams merged). Thread-safe."""
        with self._lock:
            return self._build(trial, salt)

    def _build(self, trial: Mapping[str, Any], salt: int) -> NeedlePrompt:
        if self._vocab is None:
            self.check_plan([trial])
        v = self._vocab
        kt, gap, vt = self._shape
        sweep, layout = _trial_sections(trial)
        content = trial.get("content")
        if content is not None:
            return self._build_padded(trial, layout, content, salt)
        q = int(layout["query"])
        start = int(layout["needle"][0])
        needles = [int(s) for s in layout.get("haystack_needles", [start])]
        question = self.question_length()
        q_start = q + 1 - question
        canvas, keys, value_index = self._haystack_canvas(trial, needles, q_start, salt)
        k = needles.index(start)
        key, key_text = v.key(keys[k])
        ids = np.empty(q + 1, np.int64)
        ids[:q_start] = canvas
        tail = np.asarray(v.question_head + tuple(key.tolist()) + v.question_tail + self.prefix.tail, np.int64)
        ids[q_start:] = tail
        value = v.values[value_index[k]]
        return NeedlePrompt(
            trial_id=int(trial["trial_id"]), haystack=int(trial.get("haystack", 0)), ids=ids,
            needle=(start, start + kt + gap + vt), key_span=(start, start + kt),
            value_span=(start + kt + gap, start + kt + gap + vt), question=(q_start, q + 1), key_text=key_text,
            answer=v.value_texts[int(value_index[k])], answer_ids=tuple(int(i) for i in value),
            prefix_length=self.prefix.length, attempt=salt,
        )

    def _build_padded(self, trial: Mapping[str, Any], layout: dict, content: Mapping[str, Any],
                      salt: int) -> NeedlePrompt:
        """A paired plan's trial (phasekv.sweep, design "paired"): the content's own prompt — its
        needle and query unpadded, one needle, the same canvas for every residue of the content —
        with `padding` one-token filler units put between the model's prefix and the content, so the
        prompts of one content differ only by that run of filler and every position after it moves
        by the padding."""
        pad = int(content["padding"])
        c, cq = int(content["needle"][0]), int(content["query"])
        if c + pad != int(layout["needle"][0]) or cq + pad != int(layout["query"]):
            raise PlacementError(f"trial {trial.get('trial_id')!r}: content needle {c} / query {cq} + padding {pad} is not "
                                 f"the layout's needle {layout['needle'][0]} / query {layout['query']} (an edited line)")
        inner = {k: v for k, v in trial.items() if k != "content"}
        inner["layout"] = dict(layout, needle=[c, c + (int(layout["needle"][1]) - int(layout["needle"][0]))],
                               query=cq, context_tokens=cq + 1, haystack_needles=[c])
        base = self._build(inner, salt)
        cut = self.prefix.length
        # The unit: a one-token filler word, another one on each re-placement (salt) of a text prompt.
        unit = self._vocab.filler[salt % len(self._vocab.filler)]
        ids = np.concatenate([base.ids[:cut], np.full(pad, unit, np.int64), base.ids[cut:]])

        def moved(span: tuple) -> tuple:
            return (span[0] + pad, span[1] + pad)

        return dataclasses.replace(base, ids=ids, needle=moved(base.needle), key_span=moved(base.key_span),
                                   value_span=moved(base.value_span), question=moved(base.question))

    def build_text(self, trial: Mapping[str, Any], *, attempts: int = 8) -> tuple[NeedlePrompt, str]:
        """(prompt, text) for a server that takes text: the prompt whose text re-encodes to exactly
        its ids, rebuilt with other content up to `attempts` times, else PlacementError."""
        reasons = []
        for salt in range(attempts):
            prompt = self.build(trial, salt=salt)
            problem, text = verify_text(self.tokenizer, prompt)
            if problem is None:
                return prompt, text
            reasons.append(problem)
        raise PlacementError(f"trial {trial['trial_id']}: no text of this prompt re-encodes to the planned tokens in "
                             f"{attempts} attempts (first: {reasons[0]})")

    def prompts(self, trials: Iterable[Mapping[str, Any]]) -> Iterator[NeedlePrompt]:
        """The prompts of `trials` in (haystack, trial_id) order, one at a time (bounded memory: one
        prompt and one haystack canvas are held)."""
        ordered = sorted(trials, key=lambda t: (t.get("haystack", 0), t["trial_id"]))
        self.check_plan(ordered)
        for t in ordered:
            yield self.build(t)


def verify_text(tokenizer: Tokenizer, prompt: NeedlePrompt) -> tuple[str | None, str]:
    """(None, text) when the prompt's text (its ids after the BOS, decoded) re-encodes to exactly
    its ids; else (why, text): where the first difference is and which planned span it moves."""
    ids = prompt.ids.tolist()
    bos = 1 if ids and tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id else 0
    text = tokenizer.decode(ids[bos:])
    again = ids[:bos] + tokenizer.encode(text)
    if again == ids:
        return None, text
    first = next((i for i, (a, b) in enumerate(zip(ids, again)) if a != b), min(len(ids), len(again)))
    where = f"position {first}"
    for name, (s, e) in (("needle", prompt.needle), ("question", prompt.question)):
        if first < s:
            where += f" (before the {name} planned at [{s}, {e}): it moves)"
            break
        if first < e:
            where += f" (inside the {name} planned at [{s}, {e}))"
            break
    return (f"re-encoding the text gives {len(again)} tokens for {len(ids)} planned, first difference at {where}: "
            f"planned {ids[first:first + 3]}, re-encoded {again[first:first + 3]}"), text


def study_128k_plan_config() -> dict:
    """The study's 128K needle sweep: S = 4, 16 residues (M = 16) × 64 trials, query at 131071,
    ~16,000 records (the template's default density), two-token records."""
    return dict(stride=4, modulus=16, trials_per_residue=64, query_position=131071, span=120000, min_distance=4096,
                record=(1, 0, 1))
