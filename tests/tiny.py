"""A tiny chat tokenizer and tiny random chat models built from a config, for fast logic tests.

The tokenizer is a byte-level BPE of ``VOCAB`` tokens trained (deterministically, in about 0.2 s)
on the dev questions that ship with draftwise, with SmolLM2's special tokens at the same ids
(0 ``<|endoftext|>``, 1 ``<|im_start|>``, 2 ``<|im_end|>``) and SmolLM2's chat template. It
round-trips any text (byte-level), so everything that handles text, chat templates and EOS
runs as on the real model, without loading the real tokenizer or a 49152-row head.

Only the equality, distribution and end-to-end tests need the real model (conftest's
``default_model``, one per session).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

VOCAB = 2048  # ids 0..2 special, 3..258 the bytes, the rest merges (cost.measure._synthetic draws ids < 2010)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# SmolLM2-135M-Instruct's template, verbatim (a default system turn when there is none)
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    from draftwise.questions import DEFAULT_QUESTIONS

    rows = [json.loads(line) for line in DEFAULT_QUESTIONS.read_text().splitlines() if line.strip()]
    return [turn for row in rows for turn in row["turns"]]


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok.to_str()


def save_tokenizer(folder: Path) -> None:
    """Write the tiny chat tokenizer (and its chat template) into ``folder``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<|endoftext|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)


def make_chat_folder(folder: Path, *, seed: int = 1, **config) -> Path:
    """A tiny random Llama (``conftest.tiny_llama_config`` with ``config``) with the tiny chat
    tokenizer, saved as a HF folder that ``load_model`` and ``--model`` accept."""
    from .conftest import random_hf_model, tiny_llama_config

    folder.mkdir(parents=True, exist_ok=True)
    settings = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, max_position_embeddings=512)
    random_hf_model(tiny_llama_config(**{**settings, **config}), seed=seed).save_pretrained(folder)
    save_tokenizer(folder)
    return folder
