"""``draftwise export-head``: write a trained draft head in the ``speculators`` layout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from draftwise.cli.common import (
    DType,
    ThreadsOpt,
    load_with_status,
    out,
    user_errors,
    warn,
)
from draftwise.eagle.drafter import fingerprint_of
from draftwise.eagle.export import (
    DEFAULT_K,
    MODEL_TYPE,
    WEIGHTS_FILE,
    check_export_dir,
    export_speculators,
    final_norm_of,
    lm_head_of,
    validate_speculators_config,
    verifier_id,
)
from draftwise.eagle.files import load_head


def export_head_cmd(
    head: Annotated[Path, typer.Argument(help="A `draftwise train-head` output folder.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="New or empty folder for config.json + model.safetensors.")],
    verifier: Annotated[
        str | None,
        typer.Option(help="The target's Hugging Face id, as vLLM serves it (default: known for built-in targets)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="The target, to read its final norm from (default: the head's target)."),
    ] = None,
    k: Annotated[int, typer.Option("--k", min=1, help="Draft tokens per step, written as the default.")] = DEFAULT_K,
    dtype: Annotated[DType, typer.Option("--dtype", help="Weights dtype in the file.")] = DType.float32,
    validate: Annotated[
        bool, typer.Option("--validate/--no-validate", help="Check config.json with the `speculators` package, if importable.")
    ] = True,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an earlier export in --out.")] = False,
    threads: ThreadsOpt = None,
) -> None:
    """Write HEAD as a speculators EAGLE checkpoint: type 'eagle3' for a head trained with
    --arch eagle3 (the type vLLM loads), else 'eagle' (EAGLE-1 with layernorms).

    The target is loaded once, to check the head was trained for it and to copy its final norm
    and (eagle3) its LM head rows, which the head borrows. What the layout cannot say exactly is listed in
    config.json under draftwise.not_represented; see ``draftwise.eagle.export``.
    """
    with user_errors():
        loaded = load_head(head)  # a missing or damaged head: one line, before anything loads
        check_export_dir(out_dir, overwrite=overwrite)
        target_name = (loaded.meta.get("target") or {}).get("name")
        hf_id = verifier_id(target_name, verifier)
        target = load_with_status(model or str(target_name or "default"), "float32", threads=threads)
        load_head(head, fingerprint=fingerprint_of(target))  # refuses a head made for another target
        folder = export_speculators(
            head, out_dir, verifier=hf_id, final_norm=final_norm_of(target), lm_head=lm_head_of(target), k=k, dtype=dtype.value,
            max_positions=getattr(target.config, "max_position_embeddings", None), overwrite=overwrite,
        )
    size = (folder / WEIGHTS_FILE).stat().st_size / 2**20
    kind = "eagle3" if loaded.head.cfg.arch == "eagle3" else MODEL_TYPE
    out.print(
        f"head written to {folder}: speculators {kind!r} layout, verifier {hf_id}, k={k}, "
        f"{WEIGHTS_FILE} {size:.1f} MiB",
        highlight=False, markup=False,
    )
    if validate:
        problem = validate_speculators_config(folder)
        if problem is None:
            out.print("config.json validated with speculators' own config classes", highlight=False, markup=False)
        else:
            warn(problem)
