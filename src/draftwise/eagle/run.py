"""The ``train-head`` run: check the options, make the data, extract features, train, save.

Files under the output folder ``OUT``:

=============================  ==============================================================
``.draftwise-output``          the marker: ``--overwrite`` deletes, ``--resume`` continues, only
                               a folder that carries ``train-head``'s
``eagle_head.safetensors``,    the head (:func:`~draftwise.eagle.files.save_head`): its
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
With ``corpus`` (:mod:`.corpus`) the sequences are fixed conversations cut to ``seq_len`` tokens,
not the target's answers: ``conversations`` of the corpus's training side, and held-out ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftwise.eagle.data import (
    corpus_sequences,
    heldout_sequences,
    magpie_prompts,
    magpie_questions,
)
from draftwise.eagle.features import FeatureStore, extract_features
from draftwise.eagle.files import save_head, target_fingerprint
from draftwise.eagle.head import ARCHS, EagleHead, default_aux_layers
from draftwise.eagle.train import HeadStep, TargetParts, build_head, train_head_loop
from draftwise.errors import ConfigError
from draftwise.fsutil import (
    check_output_dir,
    check_writable,
    claim_output_dir,
    is_owned_by,
)
from draftwise.questions import DEFAULT_QUESTIONS, Question, read_questions
from draftwise.runtime.loaders import load_model, parse_device
from draftwise.training.checkpoint import load_safely, save_checkpoint
from draftwise.training.data import (
    frequent_tokens,
    make_sequences,
    ordered_prompts,
    split_questions,
)
from draftwise.training.loop import RunProgress, resume_from, start_log
from draftwise.training.options import (
    check_numbers,
    check_temperatures,
    resolve_settings,
)
from draftwise.training.outputs import portable_command, write_heldout

COMMAND = "train-head"
#: the settings ``--corpus`` passes to :func:`~.corpus.corpus_sequences`
CORPUS_KEYS = ("conversations", "seq_len", "seed", "holdout_percent")
#: the settings that define a run; ``--resume`` keeps the checkpoint's and refuses others
DEFAULTS: dict[str, Any] = {
    "magpie": 0, "gen_tokens": 256, "gen_temperatures": [0.0, 0.7], "seed": 0, "vocab_size_draft": 8192,
    "batch": 4, "seq_len": 512, "lr": 1e-3, "reg_weight": 0.0, "noise": 0.0, "init": "layer",
    "holdout_percent": 5.0, "response_only": False, "feature_norm": False, "arch": "eagle1", "ttt": 1,
    "corpus": None, "conversations": 256, "weight_decay": 0.0,
}
DEFAULT_STEPS = 500
_RULES = {  # name: (minimum, integer, strict)
    "magpie": (0, True, False), "gen_tokens": (1, True, False), "seed": (0, True, False),
    "vocab_size_draft": (0, True, False), "batch": (1, True, False), "seq_len": (2, True, False),
    "lr": (0, False, True), "reg_weight": (0, False, False), "noise": (0, False, False),
    "holdout_percent": (0, False, False), "steps": (1, True, False), "time_budget": (0, False, True),
    "snapshot_every": (1, True, False), "ttt": (1, True, False), "conversations": (1, True, False),
    "weight_decay": (0, False, False), "max_disk": (1, True, False),
}
Status = Callable[[str], None]
Phase = Callable[[str, int, int], None]


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


@dataclass
class _Plan:
    """What the checks settled before the output folder is touched."""

    out: Path
    data: Path  # the data cache: --data-dir, or OUT/data
    target: Any
    device: torch.device
    settings: dict[str, Any]  # DEFAULTS' keys, resolved
    steps: int
    ckpt: dict[str, Any] | None  # the checkpoint resumed from, dropped once loaded
    train_rows: list[Question]
    held_rows: list[Question]

    @property
    def full(self) -> dict[str, Any]:
        """The settings the checkpoint and the head's meta keep."""
        return {"target": self.target.name, **self.settings}

    @property
    def vocab(self) -> int:
        return int(self.target.runtime.vocab_size)


@dataclass
class _HeadData:
    """The training data: target answers, their features, and which of them are held out."""

    magpie_texts: list[str]
    sequences: list[list[int]]
    store: FeatureStore
    train_seqs: list[int]
    held_seqs: list[int]
    phase: dict[str, float]  # seconds per data phase (and, at the end, "train")
    corpus: dict[str, Any] | None = None  # what the corpus reader read, dropped and kept


def _check(values: dict[str, Any]) -> None:
    """Refuse an option out of range, by name, before anything is loaded."""
    check_numbers({k: v for k, v in values.items() if k in _RULES}, _RULES)
    if values.get("gen_temperatures") is not None:
        check_temperatures(values["gen_temperatures"])
    if values.get("holdout_percent") is not None and values["holdout_percent"] >= 100:
        raise ConfigError(f"--holdout-percent {values['holdout_percent']} leaves nothing to train on; pass less than 100")
    if values.get("corpus") and values.get("magpie"):
        raise ConfigError("--corpus replaces the dev prompts' answers and Magpie's: pass --magpie 0 with --corpus")


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
    max_disk: int | None = None,
    questions: Sequence[Question] | None = None,
    command: str | None = None,
    on_status: Callable[[str], None] | None = None,
    on_phase: Callable[[str, int, int], None] | None = None,
    on_step: Callable[[HeadStep], bool | None] | None = None,
    **options: Any,
) -> HeadResult:
    """Train an EAGLE draft head for ``target`` and save it to ``out_dir`` (see the module doc).

    ``options`` are the keys of :data:`DEFAULTS` (None or absent: the default, or on resume the
    checkpoint's). ``max_disk``: bytes the feature store may take (checked before extraction). ``questions`` (default: the shipped dev questions) are split as
    :func:`~.data.split_questions` does; only the training part is used. ``on_phase(name, done,
    total)`` reports the data phases (``magpie``, ``answers``, ``features``).

    Example::

        from draftwise import load_model
        from draftwise.eagle.run import train_head
        result = train_head(load_model("default"), "heads/smol", magpie=200, steps=600)
        result.heldout["acceptance"]
    """
    status = on_status or (lambda message: None)
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"train_head got unknown options {unknown}; known: {sorted(DEFAULTS)}")
    _check({**options, "steps": steps, "time_budget": time_budget, "snapshot_every": snapshot_every, "max_disk": max_disk})
    out = Path(out_dir).expanduser()
    data = Path(data_dir).expanduser() if data_dir is not None else out / "data"
    plan = _plan(target, out, data, parse_device(device), options, steps, questions, resume=resume,
                 overwrite=overwrite, status=status)
    if data != out / "data":
        check_writable(data, "data folder")
    if not resume:  # from here on, the folder is ours
        claim_output_dir(out, COMMAND, overwrite=overwrite, holds="a train-head run")

    made = _make_data(plan, status, on_phase or (lambda name, done, total: None), max_disk)
    draft_tokens = _draft_tokens(plan, made)
    head, opt, run, heldout = _setup_head(plan, status)
    heldout = _train(plan, made, draft_tokens, head, opt, run, status, time_budget=time_budget,
                     snapshot_every=snapshot_every, on_step=on_step) or heldout
    made.phase["train"] = round(run.seconds, 2)  # cumulative over resumed parts: steps and evaluations
    _save(plan, made, head, draft_tokens, run, heldout, command)
    return HeadResult(
        out, run.step, plan.steps, run.stopped, run.first_loss, run.loss, heldout,
        len(draft_tokens) if draft_tokens else plan.vocab, len(made.train_seqs), len(made.held_seqs), made.phase,
    )


def _plan(
    target: Any, out: Path, data: Path, device: torch.device, options: dict[str, Any], steps: int | None,
    questions: Sequence[Question] | None, *, resume: bool, overwrite: bool, status: Status,
) -> _Plan:
    """Check the output folder, the checkpoint (on resume), the target and the settings,
    touching nothing; every bad option fails here, before the slow work."""
    ckpt = check_out(out, resume=resume, overwrite=overwrite)
    saved = ckpt["settings"] if ckpt is not None else None
    if isinstance(target, (str, Path)):
        status(f"loading target {target}")
        target = load_model(target, device=device)
    if not hasattr(target.runtime, "capture_features"):
        raise ConfigError(f"train-head needs the native runtime's feature capture; {target.name} runs on another runtime")
    if saved is not None and saved.get("target") != target.name:
        raise ConfigError(f"the checkpoint in {out} trains a head for {saved.get('target')!r}, not {target.name!r}")
    settings = resolve_settings({key: options.get(key) for key in DEFAULTS}, saved, DEFAULTS)
    _check_against_target(settings, target)
    steps = steps if steps is not None else int(ckpt["planned_steps"]) if ckpt is not None else DEFAULT_STEPS
    rows = list(questions) if questions is not None else read_questions(DEFAULT_QUESTIONS)
    train_rows, held_rows = split_questions(rows)
    if not train_rows:
        raise ConfigError("the questions leave no training prompts after the hold-out split")
    return _Plan(out, data, target, device, settings, steps, ckpt, train_rows, held_rows)


def _check_against_target(settings: dict[str, Any], target: Any) -> None:
    """Refuse settings that name no known choice or do not fit ``target``."""
    if settings["init"] not in ("layer", "random"):
        raise ConfigError(f"--init {settings['init']!r} is not one of layer, random")
    if settings["arch"] not in ARCHS:
        raise ConfigError(f"--arch {settings['arch']!r} is not one of {', '.join(ARCHS)}")
    vocab = int(target.runtime.vocab_size)
    if settings["vocab_size_draft"] > vocab:
        raise ConfigError(f"--vocab-size-draft {settings['vocab_size_draft']} exceeds the target's vocabulary ({vocab}); 0 = all")
    if settings["seq_len"] >= target.runtime.max_context:
        raise ConfigError(f"--seq-len {settings['seq_len']} must be below the target's context ({target.runtime.max_context})")


def _make_data(plan: _Plan, status: Status, bar: Phase, max_disk: int | None) -> _HeadData:
    """The sequences (the target's answers, or a corpus's conversations) and their features (each
    phase cached and timed), and the split of the sequences into training and held-out ones."""
    target, settings, data = plan.target, plan.settings, plan.data
    phase = dict(plan.ckpt.get("phase_seconds", {})) if plan.ckpt is not None else {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        result = fn()
        phase[name] = round(phase.get(name, 0.0) + time.perf_counter() - t0, 2)
        return result

    if settings["corpus"]:
        dev = [t for q in (*plan.train_rows, *plan.held_rows) for t in q.turns]
        status(f"corpus: {settings['corpus']}, {settings['conversations']} conversations and held-out ones")
        texts, (sequences, prompt_lens, held_flags, stats) = [], timed("corpus", lambda: corpus_sequences(
            settings["corpus"], target.tokenizer, **{k: settings[k] for k in CORPUS_KEYS}, dev_texts=dev,
            on_progress=lambda d, t: bar("corpus (MB)", d >> 20, t >> 20)))
        status(f"corpus: {stats['summary']}")
    else:
        (texts, sequences, prompt_lens, held_flags), stats = _answer_sequences(plan, status, bar, timed), None
    write_heldout(data, plan.held_rows)
    status(f"features: one target pass per sequence ({len(sequences)}, cached in {data / 'features'})")
    aux_layers = default_aux_layers(int(target.runtime.num_layers)) if settings["arch"] == "eagle3" else None
    store = timed("features", lambda: extract_features(
        target, sequences, prompt_lens, data, aux_layers=aux_layers, max_disk=max_disk, on_status=status,
        on_progress=lambda d, t: bar("features", d, t),
    ))
    train_seqs = [i for i, h in enumerate(held_flags) if not h]
    held_seqs = [i for i, h in enumerate(held_flags) if h]
    return _HeadData(texts, sequences, store, train_seqs, held_seqs, phase, stats)


def _answer_sequences(
    plan: _Plan, status: Status, bar: Phase, timed: Callable[[str, Callable[[], Any]], Any]
) -> tuple[list[str], list[list[int]], list[int], list[bool]]:
    """``(magpie texts, sequences, prompt lengths, held-out flags)``: the target's answers to the dev
    questions' training split and to Magpie prompts."""
    target, settings, data = plan.target, plan.settings, plan.data
    held_texts = [t for q in plan.held_rows for t in q.turns]
    if settings["magpie"]:
        status(f"Magpie: {settings['magpie']} instructions written by the target (cached in {data})")
    texts = timed("magpie", lambda: magpie_prompts(
        target, settings["magpie"], data, held_out=held_texts, seed=settings["seed"], device=plan.device,
        on_progress=lambda d, t: bar("magpie", d, t),
    ))
    prompts = ordered_prompts(plan.train_rows) + magpie_questions(texts)
    temps = [float(t) for t in settings["gen_temperatures"]]
    status(f"answers: {len(prompts)} prompts x {len(temps)} continuations of up to {settings['gen_tokens']} tokens")
    gen = dict(gen_tokens=settings["gen_tokens"], gen_temperatures=temps, seed=settings["seed"])
    n_dev = len(plan.train_rows)

    def answers() -> list[list[int]]:
        dev = make_sequences(target, prompts[:n_dev], data, **gen, on_progress=lambda d, t: bar("answers", d, t))
        n = len(dev)
        mag = make_sequences(target, prompts[n_dev:], data, **gen, on_progress=lambda d, t: bar("answers", n + d, n + t)) if texts else []
        return dev + mag

    sequences = timed("answers", answers)
    prompt_lens = [len(target.encode_prompt(q.prompt)) for q in prompts for _ in temps]
    held_flags = heldout_sequences([q.prompt for q in prompts for _ in temps], settings["holdout_percent"])
    return texts, sequences, prompt_lens, held_flags


def _draft_tokens(plan: _Plan, made: _HeadData) -> list[int] | None:
    """The draft vocabulary: the checkpoint's on resume, else the most frequent training tokens
    (None: the whole vocabulary)."""
    if plan.ckpt is not None:
        return plan.ckpt.get("vocab_subset")
    n = plan.settings["vocab_size_draft"]
    if not 0 < n < plan.vocab:
        return None
    eos = sorted(int(t) for t in plan.target.eos_token_ids)
    return frequent_tokens([made.sequences[i] for i in made.train_seqs], n, plan.vocab, eos)


def _setup_head(
    plan: _Plan, status: Status
) -> tuple[EagleHead, torch.optim.Optimizer, RunProgress, dict[str, float] | None]:
    """The head, its optimizer, the run's totals and the last held-out measurement: fresh, or
    (resume) the checkpoint's; the log is cut to the steps the run starts from."""
    settings, ckpt = plan.settings, plan.ckpt
    head = build_head(
        plan.target, init=settings["init"], seed=settings["seed"], feature_norm=settings["feature_norm"],
        arch=settings["arch"],
    ).to(plan.device)
    opt = torch.optim.AdamW(head.parameters(), lr=settings["lr"], betas=(0.9, 0.95), weight_decay=settings["weight_decay"])
    if ckpt is not None:
        status(f"resuming at step {ckpt['step']}")
    run = resume_from(ckpt, head, opt)
    heldout = ckpt.get("heldout") if ckpt is not None else None
    start_log(plan.out / "train_log.jsonl", run.step, resumed=ckpt is not None)
    plan.ckpt = None  # the weights live in the head now
    return head, opt, run, heldout


def _train(
    plan: _Plan, made: _HeadData, draft_tokens: list[int] | None, head: EagleHead, opt: torch.optim.Optimizer,
    run: RunProgress, status: Status, *, time_budget: float | None, snapshot_every: int,
    on_step: Callable[[HeadStep], bool | None] | None,
) -> dict[str, float] | None:
    """Train from ``run.step`` to ``plan.steps``, measuring held-out acceptance and checkpointing
    every ``snapshot_every`` steps; returns the last measurement."""

    def checkpoint(heldout: dict[str, float] | None) -> None:
        state = {
            "step": run.step, "planned_steps": plan.steps, "tokens": run.tokens, "seconds": run.seconds,
            "first_loss": run.first_loss, "settings": plan.full, "vocab_subset": draft_tokens,
            "phase_seconds": made.phase, "heldout": heldout,
        }
        save_checkpoint(plan.out / "checkpoints", head, opt, state)

    parts = TargetParts.of(plan.target.runtime, draft_tokens, plan.device)
    eos = set(int(t) for t in plan.target.eos_token_ids)
    status(f"training: steps {run.step + 1}..{plan.steps}, {len(made.train_seqs)} sequences "
           f"({len(made.held_seqs)} held out), draft vocabulary {len(draft_tokens) if draft_tokens else plan.vocab}")
    with (plan.out / "train_log.jsonl").open("a", encoding="utf-8") as log:
        return train_head_loop(
            head, opt, parts, made.store, made.train_seqs, made.held_seqs, plan.full, plan.steps, run, log, eos=eos,
            device=plan.device, time_budget=time_budget, snapshot_every=snapshot_every,
            data_seconds=sum(made.phase.values()), checkpoint=checkpoint, on_step=on_step,
        )


def _save(
    plan: _Plan, made: _HeadData, head: EagleHead, draft_tokens: list[int] | None, run: RunProgress,
    heldout: dict[str, float] | None, command: str | None,
) -> None:
    """The head folder: weights, draft vocabulary, and how the head was made (no machine paths)."""
    target, d = plan.target, int(plan.target.config.hidden_size)
    save_head(
        plan.out, head.cpu(), draft_tokens=draft_tokens,
        target={
            "name": target.name, "fingerprint": target_fingerprint(target.tokenizer, d, plan.vocab), "hidden_size": d,
            "vocab_size": plan.vocab, "num_layers": int(target.runtime.num_layers),
        },
        extra={
            "settings": plan.full, "steps": run.step, "planned_steps": plan.steps, "stopped": run.stopped,
            "first_loss": run.first_loss, "final_loss": run.loss, "train_sequences": len(made.train_seqs),
            "heldout_sequences": len(made.held_seqs), "magpie_prompts": len(made.magpie_texts), "corpus": made.corpus,
            "seconds": made.phase, "heldout": heldout, "command": portable_command(command),
        },
    )
