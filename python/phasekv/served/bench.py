"""python -m phasekv.served.bench: what the served-model tools cost on this machine.

    builder   the study's 128K needle plan (16 residues x 64 trials, ~16,000 records per prompt):
              planning time, prompts built per second (streamed: one prompt held at a time), and
              the process's peak RSS before and after (resource.getrusage)
    client    the client's own overhead per request: a sweep of small prompts against the loopback
              test server with a model that answers at once (no retrieval), requests per second

It trains a small sentencepiece model in memory for the builder's tokenizer (or takes
--tokenizer), so it needs python3-sentencepiece. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import io
import random
import resource
import sys
import tempfile
import time
import pathlib


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _trained_tokenizer():
    import sentencepiece as spm

    from . import placement
    from .tokenizers import SentencePieceTokenizer

    rng = random.Random(0)
    words = list(placement.FILLER_WORDS) + list(placement.KEY_WORDS) + ["Question:", "value"]
    corpus = [" ".join(rng.choice(words) for _ in range(12)) + f" {rng.randrange(10, 1000)}" for _ in range(6000)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=out, vocab_size=1500, model_type="bpe",
                                   byte_fallback=True, minloglevel=2, num_threads=1, hard_vocab_limit=False)
    return SentencePieceTokenizer(out.getvalue(), name="bench-bpe")


def bench_builder(tokenizer, prompts: int) -> dict:
    from .. import _phasekv as pk
    from .. import sweep
    from .placement import NeedleBuilder, RecordTemplate, study_128k_plan_config

    rss0 = _peak_rss_mib()
    started = time.perf_counter()
    o = study_128k_plan_config()
    config = pk.SweepConfig(stride=o["stride"], modulus=o["modulus"], trials_per_residue=o["trials_per_residue"],
                            query_position=o["query_position"], span=o["span"], min_distance=o["min_distance"],
                            record=pk.RecordShape(key_tokens=2, value_tokens=2))
    plan = sweep.plan(config)
    planned = time.perf_counter() - started
    builder = NeedleBuilder(tokenizer, RecordTemplate())
    started = time.perf_counter()
    built = 0
    for prompt in builder.prompts(plan.trials):
        built += 1
        if built == prompts:
            break
    seconds = time.perf_counter() - started
    return {"trials": len(plan.trials), "haystacks": len(plan.haystacks()), "plan_seconds": planned,
            "prompt_tokens": int(len(prompt.ids)), "prompts": built, "prompts_per_second": built / seconds,
            "peak_rss_mib_before": rss0, "peak_rss_mib_after": _peak_rss_mib()}


def bench_client(requests: int, concurrency: int) -> dict:
    from .client import CompletionClient, Job
    from .testserver import CompletionServer

    class Instant:
        background = -9.0

        def logprobs(self, ids):
            return {}

    class Vocab:  # the server needs only a vocabulary size and no BOS for id prompts
        bos_id = None
        eos_id = None
        vocab_size = 1000

        def decode(self, ids):
            return ""

    def job(k: int) -> Job:
        return Job(key=k, body=lambda: {"prompt": [1, 2, 3, k % 1000], "max_tokens": 1},
                   finish=lambda r, info: {"trial_id": k, "outcome": True, "latency_s": info["latency_s"]},
                   fail=lambda reason, info: {"trial_id": k, "error": reason})

    with tempfile.TemporaryDirectory() as tmp, CompletionServer(Instant(), Vocab()) as server:
        client = CompletionClient([server.url], "bench", concurrency=concurrency, progress=False)
        summary = client.run((job(k) for k in range(requests)), pathlib.Path(tmp) / "o.jsonl", total=requests)
    return {"requests": requests, "concurrency": concurrency, "seconds": summary.seconds,
            "requests_per_second": summary.requests_per_second, "mean_latency_ms": 1000 * summary.latency_mean_s,
            "errors": summary.errors}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phasekv.served.bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32, help="128K prompts to build")
    parser.add_argument("--requests", type=int, default=2000, help="requests of the client benchmark")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads")
    parser.add_argument("--tokenizer", help="a tokenizer spec (default: a small BPE trained here)")
    args = parser.parse_args(argv)
    if args.tokenizer:
        from .tokenizers import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    else:
        tokenizer = _trained_tokenizer()
    b = bench_builder(tokenizer, args.prompts)
    print(f"builder: study 128K plan, {b['trials']} trials in {b['haystacks']} haystacks, planned in "
          f"{b['plan_seconds']:.2f} s; {b['prompts']} prompts of {b['prompt_tokens']} tokens at "
          f"{b['prompts_per_second']:.1f} prompts/s ({b['prompts_per_second'] * b['prompt_tokens'] / 1e6:.2f} M tokens/s); "
          f"peak RSS {b['peak_rss_mib_before']:.0f} MiB before, {b['peak_rss_mib_after']:.0f} MiB after")
    c = bench_client(args.requests, args.concurrency)
    print(f"client: {c['requests']} requests, {c['concurrency']} threads, to a loopback server that answers at once: "
          f"{c['requests_per_second']:.0f} requests/s, mean latency {c['mean_latency_ms']:.2f} ms, {c['errors']} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
