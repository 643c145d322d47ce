"""The runtime-modes benchmark's report (:mod:`draftwise.bench.modes`): Markdown tables, a bar
plot of tokens/s per mode, and the JSON, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.plots import pyplot, save_figure, try_plot

RESULT_STEM = "runtime_modes"


def _f(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _ratio(r: dict[str, Any], key: str = "ratio_to_float32") -> str:
    s = r.get(key)
    return "-" if s is None else f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


def _vs_float32(r: dict[str, Any], n: int) -> str:
    """``3/4 to float32 (first differs at 17)``, or ``-`` without a float32 row."""
    if "plain_equal_to_float32" not in r:
        return "-"
    at = sorted(d for d in r["first_divergence_from_float32"] if d is not None)
    return f"{r['plain_equal_to_float32']}/{n} to float32" + (f" (first differs at {', '.join(map(str, at))})" if at else "")


def _gaps(d: dict[str, Any]) -> str:
    """`` (differs at 18, top-2 gap 0.031)`` per diverging prompt, or nothing."""
    pairs = [(at, gap) for at, gap in zip(d["first_divergence"], d.get("plain_top2_margin_at_divergence", []))
             if at is not None]
    return "" if not pairs else " (" + "; ".join(f"differs at {at}, top-2 gap {gap:.3g}" for at, gap in pairs) + ")"


def _speed_rows(report: dict[str, Any]) -> list[str]:
    n = report["config"]["num_prompts"]
    plain_rows = [(mode, r) for mode, r in report["results"].items()]
    peer = report.get("llama_cpp")
    if isinstance(peer, dict):
        plain_rows.append((f"llama.cpp {peer['version']}", peer))
    rows = []
    for mode, r in plain_rows:
        rows.append(
            f"| {mode} | plain | {r['plain_tokens_per_second']['median']:.1f} "
            f"| {r['plain_overall_tokens_per_second']:.1f} | {_ratio(r)} | - | {_vs_float32(r, n)} | 1.00 |"
        )
        for method, d in r.get("drafts", {}).items():
            rows.append(
                f"| {mode} | {method} | {d['tokens_per_second']['median']:.1f} "
                f"| {d['overall_tokens_per_second']:.1f} | {_ratio(d, 'ratio_to_float32_plain')} "
                f"| {d['speedup_over_plain']['median']:.2f}x | {d['greedy_equal']}/{n} to own plain{_gaps(d)} "
                f"| {_f(d['tokens_per_target_pass'], '.2f')} |"
            )
    return rows


def _fidelity_rows(report: dict[str, Any]) -> list[str]:
    rows = []
    for mode, r in report["results"].items():
        logits = r.get("prefill_logits_vs_float32") or {}
        sources = ", ".join(f"{k} {v}" for k, v in sorted(r.get("weight_sources", {}).items())) or "-"
        rows.append(
            f"| {mode} | {_f(logits.get('max_abs'), '.3g')} / {_f(logits.get('mean_abs'), '.3g')} "
            f"| {_f(logits.get('same_argmax'), 'd')} | {_f(r.get('load_seconds'), '.1f')} | {sources} |"
        )
    return rows


def render_markdown(report: dict[str, Any], plot: str | None = None) -> str:
    """The report as Markdown: speed and equality per mode and draft, then fidelity and where
    each mode's weights came from; ``plot`` is the bar plot's file name, where one was written."""
    cfg, machine = report["config"], report["machine"]
    peer = report.get("llama_cpp")
    peer_line = (
        f"llama.cpp (llama-cpp-python {peer['version']}, {peer['threads']} threads) ran `{peer['gguf']}` in the same rotation."
        if isinstance(peer, dict) else f"llama.cpp peer: {peer} (llama-cpp-python; an optional extra, not built here)."
    )
    lines = [
        f"# Runtime modes: {', '.join(report['results'])} (plain and speculative)",
        "",
        f"Model `{cfg['model']}`, {cfg['num_prompts']} prompts (first turns, round-robin over the categories "
        f"of `{Path(cfg['questions']).name}`), exactly {cfg['max_new_tokens']} new tokens each, greedy, EOS "
        "ignored; every mode in turn per prompt, the order rotating. Tokens/s include the prefill. Drafts: "
        + (", ".join(f"`{d['name']}` (k={d['k']})" for d in cfg["drafts"]) or "none") + ".",
        "",
        f"Machine: {machine['cpu_model']}, {machine['cpu_count']} CPUs, torch {machine['torch']} with "
        f"{cfg['threads']} thread(s). {peer_line}",
        "",
        "| mode | decoding | tok/s (median) | tok/s (overall) | x float32 plain (median, min-max) "
        "| x own plain (median) | output equal | tokens per target pass |",
        "|---|---|---:|---:|---:|---:|---|---:|",
        *_speed_rows(report),
        "",
        "x float32 plain and x own plain are per prompt, in the same run (that plain run's seconds / this row's "
        "seconds), then the median; tok/s overall = all tokens / all seconds. Output equal: a plain row's greedy "
        "tokens against float32's (first differing position where they differ); a speculative row's against its "
        "own mode's plain decoding (lossless: must be all); where one differs, the gap between the two largest "
        "logits plain decoding saw at that position (a near-tie: a multi-token verification pass computes "
        "slightly different logits than a 1-token pass in reduced-precision modes).",
        "",
        "| mode | prefill logits vs float32: max / mean abs diff | prefill argmax = float32's | load s "
        "| weight sources |",
        "|---|---:|---:|---:|---|",
        *_fidelity_rows(report),
        "",
        f"Prefill logits: each prompt's last-position logits against float32's, outside the timing (the max over "
        f"prompts, the mean of their means; argmax equal on that many of the {cfg['num_prompts']} prompts). Weight "
        "sources: per matmul tensor, `file` = the GGUF's own 4-bit blocks, `quantized` = quantized at load, "
        "`dense` = kept unquantized.",
        "",
    ]
    if plot:
        lines += [f"![tokens/s per mode]({plot})", ""]
    lines += [f"Wall time: {report['wall_seconds'] / 60:.1f} min. Produced by:", "", "```", report["command"], "```", ""]
    return "\n".join(lines)


def plot_modes(report: dict[str, Any], path: Path) -> Path:
    """Grouped bars: median tokens/s per mode, plain and each draft (and llama.cpp's plain)."""
    plt = pyplot()
    results = report["results"]
    groups = list(results)
    series = ["plain", *[d["name"] for d in report["config"]["drafts"]]]
    peer = report.get("llama_cpp")
    if isinstance(peer, dict):
        groups.append("llama.cpp")
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups), 3.6))
    for j, name in enumerate(series):
        xs, ys = [], []
        for g, mode in enumerate(groups):
            r = peer if mode == "llama.cpp" else results[mode]
            if name == "plain":
                ys.append(r["plain_tokens_per_second"]["median"])
            elif name in r.get("drafts", {}):
                ys.append(r["drafts"][name]["tokens_per_second"]["median"])
            else:
                continue
            xs.append(g + (j - (len(series) - 1) / 2) * width)
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("tokens/s (median over prompts)")
    ax.set_title(f"{Path(report['config']['model']).name}: {report['config']['max_new_tokens']} new tokens, greedy", fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def write_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``runtime_modes.json``, ``.png`` (where matplotlib is installed) and ``.md`` into
    ``out_dir``; returns the paths written."""
    paths = {"json": write_json_atomic(out_dir / f"{RESULT_STEM}.json", report)}
    png = try_plot(plot_modes, report, out_dir / f"{RESULT_STEM}.png", label=f"{RESULT_STEM}.png")
    if png is not None:
        paths["png"] = png
    paths["md"] = write_text_atomic(out_dir / f"{RESULT_STEM}.md", render_markdown(report, png.name if png else None))
    return paths
