"""Logits -> probabilities, the one transform shared by target and draft.

Speculative decoding is lossless only if the draft's q and the target's p are shaped by the very
same temperature, top-k and top-p. So both go through :func:`logits_to_probs`, and greedy
decoding (``temperature == 0``) is its own explicit path, :func:`argmax_ids`.

Order, as in Hugging Face ``generate``: temperature, then top-k, then top-p.

A tiny temperature is safe: the logits are shifted so their maximum is 0 before they are
divided, so ``temperature=1e-40`` gives the limit distribution (all mass on the argmax, shared
among ties) instead of ``inf / inf = NaN``. Only ``temperature == 0`` takes the greedy path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import torch

from draftwise.errors import ConfigError

#: the largest seed torch.Generator.manual_seed takes (it reads the seed as an unsigned 64-bit int)
MAX_SEED = 2**64 - 1


#: below this temperature float32 cannot divide by it; the limit distribution is used instead
_TINY = torch.finfo(torch.float32).tiny


def _is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick the next token.

    temperature: 0 means greedy (argmax); > 0 divides the logits before the softmax.
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of most likely tokens whose probability reaches top_p (1 = off).
    seed: seeds the sampler's own generator, 0 <= seed <= 2**64 - 1 (None = nondeterministic).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_number(t) or math.isnan(t):
            raise ConfigError(f"temperature={t!r} must be a number: 0 for greedy or a value > 0")
        if t < 0 or math.isinf(t):
            raise ConfigError(f"temperature={t} must be 0 (greedy) or a finite value > 0")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, Integral) or self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k!r} must be a whole number >= 0 (0 turns it off)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:  # NaN fails the comparison
            raise ConfigError(f"top_p={self.top_p!r} must be a number in (0, 1] (1 turns it off)")
        seed = self.seed
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed <= MAX_SEED
        ):
            raise ConfigError(f"seed={seed!r} must be a whole number from 0 to 2**64 - 1 ({MAX_SEED})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self) -> torch.Generator:
        """A CPU generator seeded with ``seed`` (fresh entropy when None). It stays on the CPU
        whatever device the model runs on: :func:`sample` draws there, so a seed gives the same
        random numbers on every device."""
        gen = torch.Generator()
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(int(self.seed))
        return gen


def argmax_ids(logits: torch.Tensor) -> list[int]:
    """The argmax of each row of ``logits`` (``[rows, vocab]``, or one ``[vocab]`` row) as ints,
    ties to the lowest id and a NaN counted as the largest, as ``torch.argmax`` does. Float32 logits
    on the CPU go through numpy, without a copy: on a 2-core Xeon torch's argmax over one row of the
    default model's 49,152 took 73 us and numpy's 8 us, and a batched step takes one a sequence."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        values = logits.numpy()
        return np.argmax(values.reshape(-1, values.shape[-1]), axis=-1).tolist()  # type: ignore[no-any-return]
    return logits.reshape(-1, logits.shape[-1]).argmax(dim=-1).tolist()  # type: ignore[no-any-return]


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """``[..., vocab]`` logits -> ``[..., vocab]`` float32 probabilities under ``cfg``.

    >>> cfg = SamplingConfig(temperature=1.0, top_k=2)
    >>> [round(p, 4) for p in logits_to_probs(torch.tensor([0.0, 1.0, 2.0]), cfg).tolist()]
    [0.0, 0.2689, 0.7311]
    """
    if cfg.greedy:
        raise ConfigError("temperature=0 is greedy decoding: use sampling.greedy, not probabilities")
    logits = logits.float()
    # shift the maximum to exactly 0 first (the softmax is unchanged): a tiny temperature then
    # sends the other scores to -inf and never makes inf - inf = NaN
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # [..., vocab], <= 0
    if cfg.temperature >= _TINY:
        scores = shifted / cfg.temperature
    else:  # 1 / temperature overflows float32: the T -> 0 limit, the argmax (ties share)
        scores = shifted.masked_fill(shifted < 0, float("-inf"))
    vocab = scores.shape[-1]
    if 0 < cfg.top_k < vocab:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        # drop the low tail whose total mass is <= 1 - top_p; always keep the top token
        drop_sorted = cum <= 1 - cfg.top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from ``probs`` (``[vocab]``) on the generator's device.

    Probabilities on another device (a CUDA model, a CPU generator) are copied to the generator
    first: one row per draw, small next to a model step, and torch refuses a generator on a
    different device from the tensor. On the CPU nothing is copied.
    """
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator).item())


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator) -> int:
    """The next token from one row of logits (``[vocab]``): argmax when greedy, else a sample."""
    if cfg.greedy:
        return argmax_ids(logits)[0]
    return sample(logits_to_probs(logits, cfg), generator)
