"""phasekv.served placement: needles land on their planned token positions with real tokenizers
(sentencepiece BPE and unigram, with and without byte fallback, trained here), seams that merge
are caught, and prefixes (BOS, system prompt, chat template) shift nothing unplanned."""

import dataclasses
import sys

import numpy as np
import pytest

pytest.importorskip("sentencepiece")

import phasekv as pk  # noqa: E402
from phasekv import served, sweep  # noqa: E402
from phasekv.served import placement  # noqa: E402

import served_models  # noqa: E402

# (key_tokens, value_tokens) each tokenizer can represent with the template's words.
SHAPES = {"bpe": (2, 2), "unigram": (2, 2)}


def plan_for(stride, key_tokens, value_tokens, *, query=1500, trials=16, seed=0, modulus=0):
    config = pk.SweepConfig(stride=stride, modulus=modulus, trials_per_residue=trials, query_position=query,
                            span=query - 400, min_distance=64, seed=seed,
                            record=pk.RecordShape(key_tokens=key_tokens, value_tokens=value_tokens))
    return sweep.plan(config)


def check_landed(builder, prompt, trial, *, as_text=True):
    """Every planned piece is where the plan put it, in the ids and after re-encoding the text."""
    v = builder._vocab
    kt, gap, vt = builder._shape
    t = trial["target_position"]
    q = trial["query_position"]
    assert len(prompt.ids) == q + 1
    assert prompt.needle == (t, t + kt + gap + vt)
    assert list(prompt.ids[: builder.prefix.length]) == list(builder.prefix.ids)
    key_ids = prompt.ids[t: t + kt]
    assert list(prompt.ids[t + kt + gap: t + kt + gap + vt]) == list(prompt.answer_ids)
    # The question asks this needle's key and ends at the query.
    tail = list(v.question_tail) + list(builder.prefix.tail)
    assert list(prompt.ids[q + 1 - len(tail):]) == tail
    assert list(prompt.ids[q + 1 - len(tail) - kt: q + 1 - len(tail)]) == list(key_ids)
    # Every needle of the haystack holds a record, and keys are distinct among them.
    keys = {tuple(prompt.ids[s: s + kt]) for s in trial["layout"]["haystack_needles"]}
    assert len(keys) == len(trial["layout"]["haystack_needles"])
    # Re-encoding the text gives the ids back exactly (so the needle lands when text is sent).
    if not as_text:
        return
    problem, text = served.verify_text(builder.tokenizer, prompt)  # decodes, re-encodes, compares every id
    assert problem is None, problem


@pytest.mark.parametrize("kind,byte_fallback", served_models.KINDS)
def test_every_planned_needle_lands_after_reencoding(kind, byte_fallback):
    tok = served_models.tokenizer(kind, byte_fallback)
    kt, vt = SHAPES[kind]
    density = 0.05 if kind == "bpe" else 0.0  # the unigram model's 36 keys allow no distractors
    checked = 0
    for stride, seed in ((4, 1), (8, 2)):
        plan = plan_for(stride, kt, vt, seed=seed, trials=32 if stride == 4 else 16)
        builder = served.NeedleBuilder(tok, served.RecordTemplate(density=density, decoys=0.5 if density else 0.0),
                                       stride=stride)
        by_id = {t["trial_id"]: t for t in plan.trials}
        for prompt in builder.prompts(plan.trials):
            check_landed(builder, prompt, by_id[prompt.trial_id])
            checked += 1
    assert checked == 8 * 32 + 16 * 16  # 512 placements per tokenizer, 2048 over the four


def test_random_placements_with_a_system_prompt_and_a_template():
    tok = served_models.tokenizer("bpe", True)
    rng = np.random.default_rng(5)
    head = tok.encode(" the world of") + [tok.eos_id]  # a template's head may hold special tokens
    tail = tok.encode(" Answer:")

    def template(t):
        return head, tail

    for prefix in (served.model_prefix(tok, system=" made for people who work"),
                   served.model_prefix(tok, template=template), served.model_prefix(tok, bos=False)):
        builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.03), prefix)
        for _ in range(3):
            query = int(rng.integers(600, 1500))
            plan = plan_for(int(rng.choice([2, 3, 4, 8])), 2, 2, query=query, seed=int(rng.integers(1 << 30)), trials=10)
            by_id = {t["trial_id"]: t for t in plan.trials}
            for prompt in builder.prompts(plan.trials):
                special = tok.eos_id in prompt.id_list()
                check_landed(builder, prompt, by_id[prompt.trial_id], as_text=not special)
                if special:  # a special token does not survive as text: refused, never sent misplaced
                    problem, _ = served.verify_text(tok, prompt)
                    assert problem is not None and "before the needle" in problem
    assert served.model_prefix(tok, template=template).length == 1 + len(head)
    assert served.model_prefix(tok, bos=False).length == 0


def test_trials_of_one_haystack_share_their_prompt_up_to_the_question():
    tok = served_models.tokenizer("bpe", False)
    config = pk.SweepConfig(stride=4, trials_per_residue=16, query_position=2000, query_jitter=8, span=1500,
                            min_distance=64, seed=3, record=pk.RecordShape(key_tokens=2, value_tokens=2))
    plan = sweep.plan(config)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.05))
    prompts = {p.trial_id: p for p in builder.prompts(plan.trials)}
    shared = 0
    for group in plan.haystacks():
        if len(group) < 2:
            continue
        a, b = prompts[group[0]["trial_id"]], prompts[group[1]["trial_id"]]
        # Equal up to the earlier question, less a distractor record that question cuts off.
        cut = min(a.question[0], b.question[0]) - 4
        assert np.array_equal(a.ids[:cut], b.ids[:cut])
        assert not np.array_equal(a.ids[:cut + 12], b.ids[:cut + 12])  # the questions differ
        shared += 1
    assert shared > 0


@pytest.mark.parametrize("byte_fallback,system", [(False, None), (True, "You answer from the records.")])
def test_a_paired_plan_builds_one_content_shifted_by_its_padding(byte_fallback, system):
    tok = served_models.tokenizer("bpe", byte_fallback)
    config = pk.SweepConfig(stride=4, trials_per_residue=12, query_position=2000, span=1500, min_distance=64, seed=3,
                            record=pk.RecordShape(key_tokens=2, value_tokens=2))
    plan = sweep.plan(config, design="paired")
    prefix = served.model_prefix(tok, system=system)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.05), prefix)
    prompts = {p.trial_id: p for p in builder.prompts(plan.trials)}
    P = prefix.length
    by_content = {}
    for t in plan.trials:
        prompt = prompts[t["trial_id"]]
        check_landed(builder, prompt, t)  # the needle and question where the (padded) plan put them
        pad = t["content"]["padding"]
        assert np.all(prompt.ids[P:P + pad] == builder._vocab.filler[0])
        unpadded = np.concatenate([prompt.ids[:P], prompt.ids[P + pad:]])
        by_content.setdefault(t["trial"], []).append((unpadded, prompt.answer, prompt.key_text))
    for shifted in by_content.values():
        # Every residue of a content is the same prompt (ids, key and answer) with its padding removed.
        assert len(shifted) == 8
        for unpadded, answer, key in shifted:
            assert np.array_equal(unpadded, shifted[0][0]) and (answer, key) == shifted[0][1:]
    # A plan line whose content and layout disagree (an edited line) is refused, never built.
    t = dict(plan.trials[0], content=dict(plan.trials[0]["content"], padding=plan.trials[0]["content"]["padding"] + 1))
    with pytest.raises(served.PlacementError, match="an edited line"):
        builder.build(t)


def test_single_needle_prompts_share_their_haystack_up_to_the_earlier_needles_block():
    tok = served_models.tokenizer("bpe", False)
    config = pk.SweepConfig(stride=4, trials_per_residue=10, query_position=12000, span=11000, min_distance=64, seed=3,
                            record=pk.RecordShape(key_tokens=2, value_tokens=2))
    plan = sweep.plan(config, design="single")
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.05))
    prompts = list(builder.prompts(plan.trials[:24]))
    for a, b in zip(prompts, prompts[1:]):
        assert len(a.ids) == len(b.ids) == 12001
        # One needle each, the same content everywhere else: equal ids up to the (4096-token) block of
        # the earlier needle, so a prefix cache serves that much of every prompt.
        block = min(a.needle[0], b.needle[0]) // builder._BLOCK * builder._BLOCK
        assert np.array_equal(a.ids[:block], b.ids[:block])
        assert a.needle != b.needle


def test_a_needle_before_the_prefix_or_into_the_question_is_refused():
    tok = served_models.tokenizer("bpe", True)
    plan = plan_for(4, 1, 2, query=600, trials=10)
    long_system = " the" * 500
    builder = served.NeedleBuilder(tok, served.RecordTemplate(), served.model_prefix(tok, system=long_system))
    with pytest.raises(served.PlacementError, match="overlap the model's prefix"):
        builder.check_plan(plan.trials)
    config = pk.SweepConfig(stride=4, trials_per_residue=10, query_position=600, span=500, min_distance=4,
                            record=pk.RecordShape(key_tokens=1, value_tokens=2))
    long_question = served.RecordTemplate(question_head=" Question:" + " the" * 20 + " value of")
    with pytest.raises(served.PlacementError, match="overlap the question"):
        served.NeedleBuilder(tok, long_question).check_plan(sweep.plan(config).trials)


def test_plan_and_record_shape_must_agree():
    tok = served_models.tokenizer("bpe", True)
    config = pk.SweepConfig(stride=4, trials_per_residue=10, query_position=800, span=600, min_distance=64,
                            record=pk.RecordShape(key_tokens=1, value_tokens=2))
    twelve = sweep.plan(config, needle_tokens=12)
    with pytest.raises(served.PlacementError, match="needle_tokens = 12"):
        served.NeedleBuilder(tok).check_plan(twelve.trials)
    with pytest.raises(served.ServedInputError, match="stride 8"):
        served.NeedleBuilder(tok, stride=8).check_plan(sweep.plan(config).trials)
    with pytest.raises(served.PlacementError, match="connective"):
        served.NeedleBuilder(tok, served.RecordTemplate(connective=" is")).check_plan(sweep.plan(config).trials)


def test_a_tokenizer_that_cannot_represent_the_template_is_refused():
    tok = served_models.tokenizer("bpe", True)
    with pytest.raises(served.PlacementError, match="filler words"):
        placement.resolve(tok, served.RecordTemplate(filler_words=("zzqx", "qqjv")), key_tokens=1, gap=0, value_tokens=2)
    with pytest.raises(served.PlacementError, match="values"):
        placement.resolve(tok, served.RecordTemplate(values="words"), key_tokens=1, gap=0, value_tokens=3)
    with pytest.raises(served.PlacementError, match="distinct keys"):
        placement.resolve(tok, served.RecordTemplate(key_words=("qzxv", "jjqk")), key_tokens=1, gap=0, value_tokens=2)


def _merging_pair(tok):
    """Two ids whose decoded texts re-encode as something else (a seam that merges)."""
    pieces = [(i, tok.piece(i)) for i in range(tok.vocab_size)]
    words = [(i, p) for i, p in pieces if p.startswith("\u2581") and len(p) > 2 and p[1:].isalpha()]
    tails = [(i, p) for i, p in pieces if p.isalpha() and len(p) >= 2]
    for a, pa in words[:200]:
        for b, pb in tails[:200]:
            if tok.encode(tok.decode([a, b])) != [a, b]:
                return a, b
    raise AssertionError("no merging pair in the vocabulary")


def test_a_seam_that_merges_is_detected_and_replaced_or_refused(monkeypatch):
    tok = served_models.tokenizer("bpe", True)
    plan = plan_for(4, 2, 2, query=900, trials=10)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.02))
    trial = plan.trials[0]
    good = builder.build(trial)
    a, b = _merging_pair(tok)
    ids = good.ids.copy()
    s = good.needle[0]
    ids[s - 1], ids[s] = a, b  # the word before the needle merges with the needle's first token
    bad = dataclasses.replace(good, ids=ids)
    problem, _ = served.verify_text(tok, bad)
    assert problem is not None and "needle" in problem and f"position {s - 1}" in problem or f"position {s}" in problem

    original = builder.build
    calls = []

    def merging_at_first(t, *, salt=0):
        calls.append(salt)
        p = original(t, salt=salt)
        return bad if salt == 0 else p

    monkeypatch.setattr(builder, "build", merging_at_first)
    prompt, text = builder.build_text(trial)
    assert prompt.attempt == 1 and calls == [0, 1]
    assert served.verify_text(tok, prompt)[0] is None

    monkeypatch.setattr(builder, "build", lambda t, *, salt=0: bad)
    with pytest.raises(served.PlacementError, match="no text of this prompt re-encodes"):
        builder.build_text(trial, attempts=3)


def test_the_study_128k_preset_streams_with_bounded_memory():
    tok = served_models.tokenizer("bpe", True)
    options = served.study_128k_plan_config()
    config = pk.SweepConfig(stride=options["stride"], modulus=options["modulus"], trials_per_residue=10,
                            query_position=options["query_position"], span=options["span"],
                            min_distance=options["min_distance"], record=pk.RecordShape(key_tokens=2, value_tokens=2))
    plan = sweep.plan(config)
    builder = served.NeedleBuilder(tok, served.RecordTemplate())
    prompts = builder.prompts(plan.trials)
    assert not isinstance(prompts, list)  # a generator: one prompt at a time
    prompt = next(prompts)
    trial = next(t for t in plan.trials if t["trial_id"] == prompt.trial_id)
    assert len(prompt.ids) == 131072
    check_landed(builder, prompt, trial)
    # The density: ~16,000 records in 128K tokens (distractors + needles): two key words in a row.
    v = builder._vocab
    key_word = np.isin(prompt.ids, v.key_atoms[1][:, 0])
    records = int((key_word[:-1] & key_word[1:]).sum())
    assert 15_000 < records < 17_000


@pytest.mark.parametrize("cls,package,arg", [(served.HFTokenizersTokenizer, "tokenizers", "tokenizer.json"),
                                             (served.TransformersTokenizer, "transformers", "model-dir"),
                                             (served.TiktokenTokenizer, "tiktoken", "cl100k_base")])
def test_an_adapter_without_its_package_names_the_package(cls, package, arg):
    try:
        __import__(package)
    except ImportError:
        with pytest.raises(served.MissingPackageError, match=f"'{package}' package"):
            cls(arg)
    else:
        pytest.skip(f"{package} is installed")


def test_load_tokenizer_picks_the_adapter_or_says_why(tmp_path):
    path = tmp_path / "m.model"
    path.write_bytes(served_models.model_proto("bpe", True))
    tok = served.load_tokenizer(str(path))
    assert isinstance(tok, served.SentencePieceTokenizer) and tok.encode(" the") == served_models.tokenizer().encode(" the")
    assert isinstance(served.load_tokenizer(f"sentencepiece:{path}"), served.SentencePieceTokenizer)
    with pytest.raises(served.ServedInputError, match="no such"):
        served.load_tokenizer(str(tmp_path / "missing.model"))
    (tmp_path / "vocab.bin").write_bytes(b"x")
    with pytest.raises(served.ServedInputError, match="cannot tell its kind"):
        served.load_tokenizer(str(tmp_path / "vocab.bin"))


def test_prompts_built_from_several_threads_equal_the_serial_ones():
    import concurrent.futures

    tok = served_models.tokenizer("bpe", False)
    plan = plan_for(4, 2, 2, trials=12, seed=9, query=40000)  # ten 4,096-token blocks per haystack
    serial = {p.trial_id: p.sha256 for p in served.NeedleBuilder(tok, served.RecordTemplate(density=0.05)).prompts(plan.trials)}
    shared = served.NeedleBuilder(tok, served.RecordTemplate(density=0.05))
    shared.check_plan(plan.trials)
    trials = list(plan.trials)
    np.random.default_rng(1).shuffle(trials)  # haystacks interleaved: the cache is swapped constantly
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch constantly: a race in the haystack cache would show
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            built = dict(pool.map(lambda t: (t["trial_id"], shared.build(t).sha256), trials))
    finally:
        sys.setswitchinterval(switch)
    assert built == serial


class ChatTokenizer:
    """A sentencepiece tokenizer with a chat template (as a transformers tokenizer has one)."""

    def __init__(self, inner):
        self.inner, self.name = inner, "chat-" + inner.name
        self.bos_id, self.eos_id, self.vocab_size = inner.bos_id, inner.eos_id, inner.vocab_size
        self.encode, self.decode = inner.encode, inner.decode

    def apply_chat_template(self, messages):
        ids = [self.bos_id]
        for m in messages:
            ids += self.inner.encode(f" {m['role']}:") + self.inner.encode(m["content"]) + [self.eos_id]
        return ids + self.inner.encode(" assistant:")


def test_a_chat_template_applied_locally_counts_every_token():
    tok = ChatTokenizer(served_models.tokenizer("bpe", True))
    template = served.chat_template(tok, system="the good world")
    head, tail = template(tok)
    user = tok.encode(" the") + tok.encode(" value")
    rendered = tok.apply_chat_template([{"role": "system", "content": "the good world"},
                                        {"role": "user", "content": " the value"}])
    assert [tok.bos_id] + head + user + tail == rendered  # head and tail are exactly the template's
    prefix = served.model_prefix(tok, template=template)
    builder = served.NeedleBuilder(tok, served.RecordTemplate(density=0.02), prefix)
    plan = plan_for(4, 2, 2, trials=10, seed=4)
    by_id = {t["trial_id"]: t for t in plan.trials}
    for prompt in builder.prompts(plan.trials):
        check_landed(builder, prompt, by_id[prompt.trial_id], as_text=False)  # EOS inside: ids only
        assert list(prompt.ids[-len(tail):]) == tail and list(prompt.ids[1:1 + len(head)]) == head
    with pytest.raises(served.ServedInputError, match="no chat template"):
        served.chat_template(served_models.tokenizer("bpe", True))
