"""The ``train-head`` run: check the options, make the data, extract features, train, save.

Files under the output folder ``OUT``:

=============================  ==============================================================
``.draftwise-output``          the marker: ``--overwrite`` deletes, ``--resume`` continues, only
                               a folder that carries ``train-head``'s
``eagle_head.safetensors``,    the head (:func:`~draftwise.drafters.head_files.save_head`): its
``draftwise_head.json``        weights and draft vocabulary; the target's name and fingerprint,
                               the settings, the portable command, seconds per phase, the final
                               held-out acceptance
``data/``                      (``--data-dir``) ``sequences.jsonl``, ``magpie.jsonl``,
                               ``features/``: caches, shareable between runs of one target
``checkpoints/last.pt``        head + optimizer + step + RNG, at every snapshot and the end
``train_log.jsonl``            a line per step (loss, kl, reg, lr, seconds) and per snapshot
                               (held-out acceptance, seconds of training, seconds of data)
=============================  ==============================================================

``time_budget`` bounds the training loop (steps and held-out evaluations), not the data phases.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..drafters.eagle_head import ARCHS, default_aux_layers
from ..drafters.head_files import save_head, target_fingerprint
from ..errors import ConfigError
from ..fsutil import check_output_dir, claim_output_dir, check_writable, is_owned_by, write_text_atomic
from ..loaders import load_model, parse_device
from ..questions import DEFAULT_QUESTIONS, Question, read_questions
from .checkpoint import load_safely, save_checkpoint
from .data import frequent_tokens, make_sequences, ordered_prompts, split_questions
from .head_data import extract_features, heldout_sequences, magpie_prompts, magpie_questions
from .head_train import HeadStep, TargetParts, build_head, train_head_loop
from .loop import RunProgress
from .options import check_number
from .outputs import portable_command, write_heldout

COMMAND = "train-head"
#: the settings that define a run; ``--resume`` keeps the checkpoint's and refuses others
DEFAULTS: dict[str, Any] = {
    "magpie": 0, "gen_tokens": 256, "gen_temperatures": [0.0, 0.7], "seed": 0, "vocab_size_draft": 8192,
    "batch": 4, "seq_len": 512, "lr": 1e-3, "reg_weight": 0.0, "noise": 0.0, "init": "layer",
    "holdout_percent": 5.0, "response_only": False, "feature_norm": False, "arch": "eagle1", "ttt": 1,
}
DEFAULT_STEPS = 500
_RULES = {  # name: (minimum, integer, strict)
    "magpie": (0, True, False), "gen_tokens": (1, True, False), "seed": (0, True, False),
    "vocab_size_draft": (0, True, False), "batch": (1, True, False), "seq_len": (2, True, False),
    "lr": (0, False, True), "reg_weight": (0, False, False), "noise": (0, False, False),
    "holdout_percent": (0, False, False), "steps": (1, True, False), "time_budget": (0, False, True),
    "snapshot_every": (1, True, False), "ttt": (1, True, False),
}


@dataclass
class HeadResult:
    """What :func:`train_head` made (``heldout``: the last held-out acceptance measured)."""

    out_dir: Path
    steps: int
    planned_steps: int
    stopped: str
    first_loss: float | None
    loss: float | None
    heldout: dict[str, float] | None
    draft_vocab_size: int
    train_sequences: int
    heldout_sequences: int
    phase_seconds: dict[str, float] = field(default_factory=dict)


def _merge(explicit: dict[str, Any], saved: dict[str, Any] | None) -> dict[str, Any]:
    out = {}
    for key, default in DEFAULTS.items():
        value = explicit.get(key)
        if saved is not None and key in saved:
            if value is not None and value != saved[key]:
                flag = "--" + key.replace("_", "-")
                raise ConfigError(f"{flag} {value} differs from the checkpoint's {saved[key]}; drop it to resume, or --overwrite")
            out[key] = saved[key]
        else:
            out[key] = default if value is None else value
    return out


def _check(values: dict[str, Any]) -> None:
    for name, value in values.items():
        if name in _RULES:
            minimum, integer, strict = _RULES[name]
            check_number(name, value, minimum=minimum, integer=integer, strict=strict)
    temps = values.get("gen_temperatures")
    if temps is not None:
        if not temps:
            raise ConfigError("--gen-temperatures is empty; give at least one (0 = greedy)")
        for t in temps:
            check_number("gen_temperatures", t, minimum=0, integer=False)
    if values.get("holdout_percent") is not None and values["holdout_percent"] >= 100:
        raise ConfigError(f"--holdout-percent {values['holdout_percent']} leaves nothing to train on; pass less than 100")


def _kept_log(path: Path, step: int) -> str:
    """The log's lines up to ``step`` (a resumed run rewrites the later ones)."""
    if not path.exists():
        return ""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return "".join(kept)


def check_out(out: Path, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Refuse an ``--out`` this run may not use (touching nothing); on resume, its checkpoint."""
    if resume and overwrite:
        raise ConfigError("pass --resume (continue the run in --out) or --overwrite (start over), not both")
    if not resume:
        check_output_dir(out, COMMAND, overwrite=overwrite, holds="a train-head run")
        return None
    if not is_owned_by(out, COMMAND):
        raise ConfigError(f"nothing to resume in {out}: `draftwise train-head` did not make it; drop --resume")
    path = out / "checkpoints" / "last.pt"
    if not path.is_file():
        raise ConfigError(f"nothing to resume in {out}: no checkpoints/last.pt yet; start over with --overwrite")
    ckpt = load_safely(path, "train-head checkpoint")  # weights_only: a crafted file runs nothing
    missing = [k for k in ("model", "optimizer", "rng", "step", "planned_steps", "settings") if k not in ckpt]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}; it is not a train-head checkpoint: start over with --overwrite")
    return ckpt


def train_head(
    target: Any,
    out_dir: str | Path,
    *,
    data_dir: str | Path | None = None,
    steps: int | None = None,
    time_budget: float | None = None,
    snapshot_every: int = 50,
    resume: bool = False,
    overwrite: bool = False,
    device: str | torch.device = "cpu",
    questions: Sequence[Question] | None = None,
    command: str | None = None,
    on_status: Callable[[str], None] | None = None,
    on_phase: Callable[[str, int, int], None] | None = None,
    on_step: Callable[[HeadStep], bool | None] | None = None,
    **options: Any,
) -> HeadResult:
    """Train an EAGLE draft head for ``target`` and save it to ``out_dir`` (see the module doc).

    ``options`` are the keys of :data:`DEFAULTS` (None or absent: the default, or on resume the
    checkpoint's). ``questions`` (default: the shipped dev questions) are split as
    :func:`~.data.split_questions` does; only the training part is used. ``on_phase(name, done,
    total)`` reports the data phases (``magpie``, ``answers``, ``features``).

    Example::

        from draftwise import load_model
        from draftwise.distill.head_run import train_head
        result = train_head(load_model("default"), "heads/smol", magpie=200, steps=600)
        result.heldout["acceptance"]
    """
    status = on_status or (lambda message: None)
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"train_head got unknown options {unknown}; known: {sorted(DEFAULTS)}")
    _check({**options, "steps": steps, "time_budget": time_budget, "snapshot_every": snapshot_every})
    out = Path(out_dir).expanduser()
    data = Path(data_dir).expanduser() if data_dir is not None else out / "data"
    torch_device = parse_device(device)
    ckpt = check_out(out, resume=resume, overwrite=overwrite)
    saved = ckpt["settings"] if ckpt is not None else None
    if isinstance(target, (str, Path)):
        status(f"loading target {target}")
        target = load_model(target, device=torch_device)
    if not hasattr(target.runtime, "capture_features"):
        raise ConfigError(f"train-head needs the native runtime's feature capture; {target.name} runs on another runtime")
    if saved is not None and saved.get("target") != target.name:
        raise ConfigError(f"the checkpoint in {out} trains a head for {saved.get('target')!r}, not {target.name!r}")
    settings = _merge(options, saved)
    if settings["init"] not in ("layer", "random"):
        raise ConfigError(f"--init {settings['init']!r} is not one of layer, random")
    if settings["arch"] not in ARCHS:
        raise ConfigError(f"--arch {settings['arch']!r} is not one of {', '.join(ARCHS)}")
    aux_layers = default_aux_layers(int(target.runtime.num_layers)) if settings["arch"] == "eagle3" else None
    vocab = int(target.runtime.vocab_size)
    if settings["vocab_size_draft"] > vocab:
        raise ConfigError(f"--vocab-size-draft {settings['vocab_size_draft']} exceeds the target's vocabulary ({vocab}); 0 = all")
    if settings["seq_len"] >= target.runtime.max_context:
        raise ConfigError(f"--seq-len {settings['seq_len']} must be below the target's context ({target.runtime.max_context})")
    steps = steps if steps is not None else int(ckpt["planned_steps"]) if ckpt is not None else DEFAULT_STEPS
    rows = list(questions) if questions is not None else read_questions(DEFAULT_QUESTIONS)
    train_rows, held_rows = split_questions(rows)
    if not train_rows:
        raise ConfigError("the questions leave no training prompts after the hold-out split")
    if data != out / "data":
        check_writable(data, "data folder")
    if not resume:  # from here on, the folder is ours
        claim_output_dir(out, COMMAND, overwrite=overwrite, holds="a train-head run")

    # -- data: Magpie prompts, answers, features ------------------------------------------------
    phase = dict(ckpt.get("phase_seconds", {})) if ckpt is not None else {}
    bar = on_phase or (lambda name, done, total: None)

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        result = fn()
        phase[name] = round(phase.get(name, 0.0) + time.perf_counter() - t0, 2)
        return result

    held_texts = [t for q in held_rows for t in q.turns]
    if settings["magpie"]:
        status(f"Magpie: {settings['magpie']} instructions written by the target (cached in {data})")
    texts = timed("magpie", lambda: magpie_prompts(
        target, settings["magpie"], data, held_out=held_texts, seed=settings["seed"], device=torch_device,
        on_progress=lambda d, t: bar("magpie", d, t),
    ))
    prompts = ordered_prompts(train_rows) + magpie_questions(texts)
    temps = [float(t) for t in settings["gen_temperatures"]]
    status(f"answers: {len(prompts)} prompts x {len(temps)} continuations of up to {settings['gen_tokens']} tokens")
    gen = dict(gen_tokens=settings["gen_tokens"], gen_temperatures=temps, seed=settings["seed"])
    n_dev = len(train_rows)

    def answers() -> list[list[int]]:
        dev = make_sequences(target, prompts[:n_dev], data, **gen, on_progress=lambda d, t: bar("answers", d, t))
        n = len(dev)
        mag = make_sequences(target, prompts[n_dev:], data, **gen, on_progress=lambda d, t: bar("answers", n + d, n + t)) if texts else []
        return dev + mag

    sequences = timed("answers", answers)
    seq_prompts = [q.prompt for q in prompts for _ in temps]
    prompt_lens = [len(target.encode_prompt(q.prompt)) for q in prompts for _ in temps]
    write_heldout(data, held_rows)
    status(f"features: one target pass per sequence ({len(sequences)}, cached in {data / 'features'})")
    store = timed("features", lambda: extract_features(
        target, sequences, prompt_lens, data, aux_layers=aux_layers, on_progress=lambda d, t: bar("features", d, t)
    ))
    held_flags = heldout_sequences(seq_prompts, settings["holdout_percent"])
    train_seqs = [i for i, h in enumerate(held_flags) if not h]
    held_seqs = [i for i, h in enumerate(held_flags) if h]

    # -- the head ---------------------------------------------------------------------------------
    eos = set(int(t) for t in target.eos_token_ids)
    if ckpt is not None:
        draft_tokens = ckpt.get("vocab_subset")
    elif 0 < settings["vocab_size_draft"] < vocab:
        draft_tokens = frequent_tokens([sequences[i] for i in train_seqs], settings["vocab_size_draft"], vocab, sorted(eos))
    else:
        draft_tokens = None
    parts = TargetParts.of(target.runtime, draft_tokens, torch_device)
    head = build_head(
        target, init=settings["init"], seed=settings["seed"], feature_norm=settings["feature_norm"], arch=settings["arch"]
    )
    head = head.to(torch_device)
    opt = torch.optim.AdamW(head.parameters(), lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    run = RunProgress()
    heldout: dict[str, float] | None = None
    if ckpt is not None:
        status(f"resuming at step {ckpt['step']}")
        head.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        run = RunProgress(ckpt["step"], ckpt.get("tokens", 0), ckpt.get("seconds", 0.0), ckpt.get("first_loss"))
        heldout = ckpt.get("heldout")
        ckpt = None
    log_path = out / "train_log.jsonl"
    write_text_atomic(log_path, _kept_log(log_path, run.step) if saved is not None else "")
    full = {"target": target.name, **settings}

    def checkpoint(heldout: dict[str, float] | None) -> None:
        state = {
            "step": run.step, "planned_steps": steps, "tokens": run.tokens, "seconds": run.seconds,
            "first_loss": run.first_loss, "settings": full, "vocab_subset": draft_tokens, "phase_seconds": phase,
            "heldout": heldout,
        }
        save_checkpoint(out / "checkpoints", head, opt, state)

    status(f"training: steps {run.step + 1}..{steps}, {len(train_seqs)} sequences ({len(held_seqs)} held out), "
           f"draft vocabulary {len(draft_tokens) if draft_tokens else vocab}")
    data_seconds = sum(phase.values())
    with log_path.open("a", encoding="utf-8") as log:
        heldout = train_head_loop(
            head, opt, parts, store, train_seqs, held_seqs, full, steps, run, log, eos=eos, device=torch_device,
            time_budget=time_budget, snapshot_every=snapshot_every, data_seconds=data_seconds,
            checkpoint=checkpoint, on_step=on_step,
        ) or heldout
    phase["train"] = round(run.seconds, 2)  # cumulative over resumed parts: steps and evaluations

    # -- the head folder --------------------------------------------------------------------------
    d = int(target.config.hidden_size)
    save_head(
        out, head.cpu(), draft_tokens=draft_tokens,
        target={
            "name": target.name, "fingerprint": target_fingerprint(target.tokenizer, d, vocab), "hidden_size": d,
            "vocab_size": vocab, "num_layers": int(target.runtime.num_layers),
        },
        extra={
            "settings": full, "steps": run.step, "planned_steps": steps, "stopped": run.stopped,
            "first_loss": run.first_loss, "final_loss": run.loss, "train_sequences": len(train_seqs),
            "heldout_sequences": len(held_seqs), "magpie_prompts": len(texts), "seconds": phase,
            "heldout": heldout, "command": portable_command(command),
        },
    )
    return HeadResult(
        out, run.step, steps, run.stopped, run.first_loss, run.loss, heldout,
        len(draft_tokens) if draft_tokens else vocab, len(train_seqs), len(held_seqs), phase,
    )
