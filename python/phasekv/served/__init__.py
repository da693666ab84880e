"""Measuring the models people serve: token-exact needle prompts for any tokenizer, the padding
experiment, and a resumable client for OpenAI-compatible completion servers (docs/SERVED.md).

Pure Python (stdlib + NumPy) on top of phasekv's sweep protocol:

- ``tokenizers``: the Tokenizer protocol and its adapters (sentencepiece, Hugging Face tokenizers
  and transformers, tiktoken), each optional;
- ``placement``: needle prompts on token ids (NeedleBuilder), checked text (verify_text);
- ``client``: CompletionClient (concurrency, retries, replicas, resume);
- ``responses``: logprobs out of vLLM / SGLang / OpenAI / llama.cpp responses;
- ``needle`` and ``padding``: the two experiments;
- ``testserver``: a real loopback server with a model of known truth and fault injection.
"""

from .client import CompletionClient, Job, RequestFailed, RunSummary, read_finished
from .errors import EndpointError, MissingPackageError, PlacementError, ServedInputError
from .needle import answer_matches, needle_jobs, preflight_needle
from .placement import (NeedleBuilder, NeedlePrompt, Prefix, RecordTemplate, chat_template, model_prefix, resolve,
                        study_128k_plan_config, verify_text)
from .responses import Completion, TokenLogprob, parse_completion
from .tokenizers import (HFTokenizersTokenizer, SentencePieceTokenizer, TiktokenTokenizer, Tokenizer,
                         TransformersTokenizer, load_tokenizer)

__all__ = [
    "Completion", "CompletionClient", "EndpointError", "HFTokenizersTokenizer", "Job", "MissingPackageError",
    "NeedleBuilder", "NeedlePrompt", "PlacementError", "Prefix", "RecordTemplate", "RequestFailed", "RunSummary",
    "SentencePieceTokenizer", "ServedInputError", "TiktokenTokenizer", "TokenLogprob", "Tokenizer",
    "TransformersTokenizer", "answer_matches", "chat_template", "load_tokenizer", "model_prefix", "needle_jobs", "parse_completion",
    "preflight_needle", "read_finished", "resolve", "study_128k_plan_config", "verify_text",
]
