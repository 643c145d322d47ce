"""Training an EAGLE draft head: its start, its batches, its loss, its held-out metric, the loop.

Row t of a sequence feeds the head the target's feature f_t and the embedding of x_{t+1}, at
position t; the head predicts f'_{t+1}, and the target's final norm and head rows turn it into
q(x_{t+2}). The teacher is the target at position t+1: p(v) = exp(z_v(f_{t+1}) - lse_{t+1}),
exact over any subset of the vocabulary because lse is the full vocabulary's. Per row::

    loss = sum_{v in V'} p(v) (log p(v) - log q(v))  +  reg_weight * smoothL1(f'_{t+1}, f_{t+1})

(the first term is KL(p || q) over the draft vocabulary V'; EAGLE-1 adds the second). With
``noise`` > 0 the input feature f_t gets uniform noise in [-noise, noise] (EAGLE), since at
drafting time the head reads its own, imperfect, features.

Held-out metric, teacher-forced greedy acceptance at k = 1: over the rows of the held-out
sequences whose target position t+1 is in the response (j >= prompt length, and not the
position after an end-of-sequence token), the fraction where the draft token (argmax of q over
V') equals the target's argmax over its full vocabulary; and the same over the rows whose target
token is in V' (what a better head could reach with this vocabulary).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import torch
import torch.nn.functional as F

from draftwise.eagle.features import FeatureStore
from draftwise.eagle.head import EagleHead, HeadConfig
from draftwise.eagle.parts import TargetParts
from draftwise.errors import ConfigError
from draftwise.runtime.native import load_state_dict
from draftwise.training.data import batch_indices
from draftwise.training.loop import (
    GRAD_CLIP,
    RunProgress,
    graceful_interrupt,
    lr_schedule,
)


def build_head(target: Any, *, init: str, seed: int, feature_norm: bool = False, arch: str = "eagle1") -> EagleHead:
    """A head of the target's layer shape. ``init="layer"``: the decoder layer starts as the
    target's last layer and fc passes the feature through (EAGLE-1: fc = [0 | I]; EAGLE-3: the
    highest of the fused layers, fc = [0 | 0 | I]), so the first step starts from "run the last
    layer once more"; ``"random"``: torch's default initialisation. ``feature_norm``: RMS-normalise
    the input feature first (EAGLE-1; see :class:`HeadConfig`). ``arch``: eagle1 or eagle3."""
    cfg = HeadConfig.from_target(target.config, feature_norm=feature_norm, arch=arch)
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    if init == "layer":
        prefix = f"model.layers.{int(target.config.num_hidden_layers) - 1}."
        state = load_state_dict(target.folder)
        head.init_from_layer({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
        d = cfg.hidden_size
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.weight[:, -d:] = torch.eye(d)
    elif init != "random":
        raise ConfigError(f"--init {init!r} is not one of layer, random")
    return head


@dataclass
class HeadBatch:
    """Rows of B sequences, right-padded to n: inputs, teacher and masks."""

    embeds: torch.Tensor  # [B, n, d] embed(x_{t+1})
    feats: torch.Tensor  # [B, n, d] f_t (EAGLE-3: [B, n, 3d], the fused layers at t)
    positions: torch.Tensor  # [B, n] t
    next_feats: torch.Tensor  # [B, n, d] f_{t+1}
    lse: torch.Tensor  # [B, n] of position t+1
    top: torch.Tensor  # [B, n] the target's argmax at t+1
    train: torch.Tensor  # [B, n] bool: rows in the loss
    response: torch.Tensor  # [B, n] bool: rows in the held-out metric


def make_head_batch(
    store: FeatureStore, seqs: Sequence[int], parts: TargetParts, *, window: int | None, eos: set[int],
    response_only: bool, device: torch.device,
) -> HeadBatch:
    """Rows t = lo .. L-2 of each sequence in ``seqs``, lo = L - 1 - ``window`` (None: 0), so the
    window ends at the sequence's end and always holds its response."""
    spans = []
    for i in seqs:
        L = store.lengths[i]
        spans.append((i, L, store.prompt_lens[i], 0 if window is None else max(0, L - 1 - window)))
    B, n = len(spans), max(1, max(L - 1 - lo for _, L, _, lo in spans))
    feats = torch.zeros(B, n + 1, store.width, dtype=torch.float32)
    aux = torch.zeros(B, n, store.aux_width, dtype=torch.float32) if store.has_aux else None
    x_next = torch.zeros(B, n, dtype=torch.long)
    lse = torch.zeros(B, n)
    top = torch.zeros(B, n, dtype=torch.long)
    positions = torch.zeros(B, n, dtype=torch.long)
    valid = torch.zeros(B, n, dtype=torch.bool)
    response = torch.zeros(B, n, dtype=torch.bool)
    for b, (i, L, P, lo) in enumerate(spans):
        m = L - 1 - lo
        if m <= 0:
            continue
        feats[b, : m + 1] = store.rows("feats", i, lo, L).float()
        if aux is not None:
            aux[b, :m] = store.rows("aux", i, lo, L - 1).float()
        ids = store.ids[i]
        x_next[b, :m] = ids[lo + 1 : L]
        lse[b, :m] = store.rows("lse", i, lo + 1, L)
        top[b, :m] = store.rows("top", i, lo + 1, L)
        positions[b, :m] = torch.arange(lo, L - 1)
        valid[b, :m] = True
        j = torch.arange(lo + 1, L)  # the target position each row is scored against
        response[b, :m] = j >= P
        if int(ids[L - 1]) in eos:  # after an end-of-sequence token p means nothing
            valid[b, m - 1] = response[b, m - 1] = False
    embeds = parts.embed(x_next.to(device))  # [B, n, d]
    train = response if response_only else valid
    inputs = feats[:, :n] if aux is None else aux
    return HeadBatch(
        embeds, inputs.to(device), positions.to(device), feats[:, 1:].to(device), lse.to(device),
        top.to(device), train.to(device), response.to(device),
    )


#: weight of training-time-test step j's KL: TTT_DECAY ** j (EAGLE-3 decays later steps)
TTT_DECAY = 0.8


def head_loss(
    head: EagleHead, parts: TargetParts, batch: HeadBatch, *, reg_weight: float, noise: float,
    generator: torch.Generator | None = None, ttt: int = 1,
) -> tuple[torch.Tensor, float, float]:
    """(loss, step 0's KL, regression part) averaged over the batch's training rows.

    ``ttt`` > 1 adds EAGLE-3's training-time test (:meth:`EagleHead.rollout`): step j's rows are
    the j-th drafted token of a chain, scored against the same teacher as step 0's row there, and
    their KL enters with weight ``TTT_DECAY ** j``."""
    f_in = batch.feats
    if noise > 0:
        u = torch.rand(f_in.shape, generator=generator).to(f_in.device)
        f_in = f_in + (2 * u - 1) * noise
    m = batch.train
    if not bool(m.any()):
        raise ConfigError("a training batch has no rows to learn from: the sequences are too short")
    preds = head.rollout(batch.embeds, head.lift(f_in), batch.positions, max(1, ttt))  # [B, n, d] each
    with torch.no_grad():
        log_p_all = parts.scores(batch.next_feats[m]) - batch.lse[m][:, None]  # [N, V'], exact p over V'
    loss = torch.zeros((), device=f_in.device)
    kl0 = 0.0
    for j, pred in enumerate(preds):
        rows = m.clone()
        rows[:, :j] = False  # no real start for rows t < j
        keep = rows[m]  # the step's rows among step 0's
        if not bool(keep.any()):
            continue
        log_q = F.log_softmax(parts.scores(pred[rows]), dim=-1)  # [N_j, V']
        log_p = log_p_all[keep]
        kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        loss = loss + TTT_DECAY**j * kl
        if j == 0:
            kl0 = float(kl.detach())
    reg = F.smooth_l1_loss(preds[0][m], batch.next_feats[m])
    return loss + reg_weight * reg, kl0, float(reg.detach())


def greedy_acceptance(
    q_logits: torch.Tensor, draft_tokens: torch.Tensor | None, target_top: torch.Tensor
) -> tuple[int, int, int, int]:
    """(hits, rows, hits among rows whose target token is in V', those rows).

    ``q_logits`` ``[N, V']`` over the draft vocabulary ``draft_tokens`` ``[V']`` (None: the
    full vocabulary), ``target_top`` ``[N]`` the target's full-vocabulary argmax.

    >>> q = torch.tensor([[0.0, 5.0], [3.0, 1.0], [0.0, 1.0]])
    >>> greedy_acceptance(q, torch.tensor([4, 7]), torch.tensor([7, 7, 9]))
    (1, 3, 1, 2)
    """
    hit = _hits(q_logits.argmax(-1), draft_tokens, target_top)
    inside = torch.ones_like(hit) if draft_tokens is None else torch.isin(target_top, draft_tokens)
    return int(hit.sum()), int(hit.numel()), int(hit[inside].sum()), int(inside.sum())


@torch.no_grad()
def evaluate_head(
    head: EagleHead, parts: TargetParts, store: FeatureStore, seqs: Sequence[int], *, eos: set[int],
    device: torch.device,
) -> dict[str, float]:
    """Teacher-forced greedy acceptance at k=1 on whole sequences ``seqs`` (see the module doc)."""
    was_training = head.training
    head.eval()
    totals = [0, 0, 0, 0]
    second = [0, 0]  # second drafted tokens right, among chains whose first was right
    for i in seqs:
        batch = make_head_batch(store, [i], parts, window=None, eos=eos, response_only=True, device=device)
        r = batch.response
        if not bool(r.any()):
            continue
        step0, step1 = head.rollout(batch.embeds, head.lift(batch.feats), batch.positions, 2)
        counts = greedy_acceptance(parts.scores(step0[r]), parts.rows, batch.top[r])
        totals = [a + b for a, b in zip(totals, counts)]
        hit0 = _hits(parts.scores(step0[0]).argmax(-1), parts.rows, batch.top[0])  # [n]
        hit1 = _hits(parts.scores(step1[0]).argmax(-1), parts.rows, batch.top[0])
        chain = r[0, 1:] & r[0, :-1] & hit0[:-1]  # row t's chain starts at real row t - 1
        second[0] += int((chain & hit1[1:]).sum())
        second[1] += int(chain.sum())
    head.train(was_training)
    hits, rows, hits_in, rows_in = totals
    return {
        "acceptance": hits / rows if rows else math.nan, "acceptance_in_vocab": hits_in / rows_in if rows_in else math.nan,
        "positions": rows, "positions_in_vocab": rows_in,
        "acceptance_second": second[0] / second[1] if second[1] else math.nan,
    }


def _hits(pick: torch.Tensor, draft_tokens: torch.Tensor | None, target_top: torch.Tensor) -> torch.Tensor:
    return (pick if draft_tokens is None else draft_tokens[pick]) == target_top


@dataclass
class HeadStep:
    """One step as the progress bar sees it (``heldout``: the last evaluation, if any)."""

    step: int
    steps: int
    loss: float
    kl: float
    reg: float
    seconds: float
    heldout: dict[str, float] | None


def train_head_loop(
    head: EagleHead, opt: Any, parts: TargetParts, store: FeatureStore, train_seqs: Sequence[int],
    held_seqs: Sequence[int], settings: dict[str, Any], steps: int, run: RunProgress, log: IO[str], *,
    eos: set[int], device: torch.device, time_budget: float | None, snapshot_every: int, data_seconds: float,
    checkpoint: Callable[[dict[str, float] | None], None], on_step: Callable[[HeadStep], bool | None] | None = None,
) -> dict[str, float] | None:
    """Train from ``run.step`` to ``steps``; every ``snapshot_every`` steps and at the end, measure
    the held-out acceptance, log it and checkpoint. Stops early (cleanly, with a checkpoint) before
    a step and evaluation that would overrun ``time_budget`` seconds, at Ctrl-C, or when
    ``on_step`` returns True. Returns the last held-out measurement."""
    if not train_seqs:
        raise ConfigError("no training sequences: every sequence was held out; lower --holdout-percent")
    lr_at = lr_schedule(settings["lr"], steps)
    params = [p for p in head.parameters() if p.requires_grad]
    interrupted = [False]
    step_times: list[float] = []
    eval_time = 0.0
    t_loop = time.perf_counter()
    last: dict[str, float] | None = None

    def measure() -> dict[str, float] | None:
        nonlocal eval_time
        if not held_seqs:
            return None
        t0 = time.perf_counter()
        result = evaluate_head(head, parts, store, held_seqs, eos=eos, device=device)
        eval_time = time.perf_counter() - t0
        run.seconds += eval_time
        entry = {"step": run.step, "seconds": round(run.seconds, 2), "data_seconds": round(data_seconds, 2),
                 "eval_seconds": round(eval_time, 2), **result}
        log.write(json.dumps(entry) + "\n")
        log.flush()
        return result

    if run.step == 0:
        last = measure()  # the curve starts at the initialisation
    head.train()
    with graceful_interrupt(interrupted):
        while run.step < steps:
            t0 = time.perf_counter()
            picked = batch_indices(run.step, settings["batch"], len(train_seqs), settings["seed"])
            batch = make_head_batch(
                store, [train_seqs[i] for i in picked], parts, window=settings["seq_len"], eos=eos,
                response_only=settings["response_only"], device=device,
            )
            lr_now = lr_at(run.step)
            for group in opt.param_groups:
                group["lr"] = lr_now
            gen = torch.Generator().manual_seed(settings["seed"] * 1_000_003 + run.step)
            loss, kl, reg = head_loss(
                head, parts, batch, reg_weight=settings["reg_weight"], noise=settings["noise"], generator=gen,
                ttt=settings.get("ttt", 1),
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP))
            opt.step()
            dt = time.perf_counter() - t0
            step_times.append(dt)
            run.step += 1
            run.tokens += int(batch.train.sum())
            run.seconds += dt
            run.loss = loss.item()
            run.first_loss = run.loss if run.first_loss is None else run.first_loss
            log.write(json.dumps({
                "step": run.step, "loss": round(run.loss, 5), "kl": round(kl, 5), "reg": round(reg, 5), "lr": lr_now,
                "grad_norm": round(grad_norm, 4), "tokens": run.tokens, "seconds": round(run.seconds, 2),
            }) + "\n")
            if on_step is not None and on_step(HeadStep(run.step, steps, run.loss, kl, reg, run.seconds, last)) is True:
                run.stopped = "callback"
            elif interrupted[0]:
                run.stopped = "interrupted"
            elif time_budget is not None and run.step < steps:
                mean = sum(step_times) / len(step_times)
                next_eval = eval_time if (run.step + 1) % snapshot_every == 0 else 0.0
                # stop unless the next step, its evaluation and the final one still fit
                if time.perf_counter() - t_loop + mean + next_eval + eval_time > time_budget:
                    run.stopped = "time budget"
            ending = run.stopped != "completed" or run.step == steps
            if ending or run.step % snapshot_every == 0:
                last = measure()
                checkpoint(last)
                if on_step is not None:
                    on_step(HeadStep(run.step, steps, run.loss, kl, reg, run.seconds, last))
            if ending:
                break
    log.flush()
    return last
