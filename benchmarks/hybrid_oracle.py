"""How much could an EAGLE head add to a copy draft? Bounds from recorded greedy answers.

For each turn of a finished ``draftwise bench`` run (its ``answers/none.jsonl``: the plain greedy
tokens) this replays every output position once, teacher-forced:

- the copy draft (``--copy``, e.g. ``suffix``) proposes its tree at ``--budget`` nodes from the
  true context, as it would in a run (a pure function of the context and of earlier answers,
  which it learns in bench order);
- the head (``--head``, e.g. ``eagle:default``) proposes a chain of up to ``--max-head`` tokens
  from the target's real features of that context (one prefill of the whole turn records them);
- the hybrid's tree is the copy tree with the head's first m tokens merged in
  (:func:`draftwise.drafters.hybrid.merge_chain`), and each proposal's accepted length is the
  greedy verifier's walk along the true tokens.

Each step is then priced two ways, with the profile's step time T(rows, context) and the head's
measured time per call of m tokens (timed here, on positions spread over the run):

- **oracle**: only the accepted path is verified, T(a + 1): a bound that no policy verifying a
  prefix or a subtree of the same proposals beats (as in ``tree_oracle.py``). For the hybrid,
  the bound chooses at every step, with hindsight, between the copy tree alone and the copy tree
  with m = 1..max-head head tokens (dynamic programming over the turn's positions: the fastest
  way through it);
- **full**: every proposed node is verified, T(nodes + 1) (what a policy without a trim pays),
  for the copy draft alone and for ``fill``/``skip_from`` rules: m head tokens where the copy
  draft proposes nothing, ``extra`` where it proposes a path shorter than ``skip_from``, none
  where it is longer; and confidence rules (``min_score``), which cut the head's chain at the
  first token whose chain score is below the threshold and pay only the head calls they ran.

Both leave out the prefill. ``oracle`` ratios say how much the head *could* add over the copy
draft; they are not speeds a run reaches. Writes ``oracle.json`` and ``oracle.md``, and the
per-position records (``records.json``, with a copy of the profile that priced them) that
``--from-records`` prices again without the model::

    python benchmarks/hybrid_oracle.py --bench benchmarks/results/hybrid-intel \\
        --out benchmarks/results/hybrid-oracle
    python benchmarks/hybrid_oracle.py --bench benchmarks/results/hybrid-intel \\
        --from-records benchmarks/results/hybrid-oracle/records.json --out /tmp/again
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from draftwise.bench.runner import build_prompt
from draftwise.cost.profile import Profile, default_profile_path
from draftwise.planner.replay import accepted_along, answer
from draftwise.drafters import make_drafter
from draftwise.eagle.drafter import EagleDrafter, default_head_folder, default_head_weights, fingerprint_of
from draftwise.eagle.files import load_head
from draftwise.drafters.hybrid import merge_chain, path_length, trusted
from draftwise.runtime.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, category_group, read_questions
from draftwise.core.sampling import SamplingConfig
from tree_oracle import extrapolated_step_time  # benchmarks/, this script's folder

TIME_EVERY = 8  # time the head's calls at every 8th position


class AtLength:
    """The target runtime as the head sees it at one position of a recorded turn: ``length``
    committed positions and their features, taken from one prefill of the whole turn."""

    def __init__(self, runtime: Any) -> None:
        self._rt, self.length, self._feats = runtime, 0, torch.empty(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rt, name)

    def capture_features(self, layers: Any = None, *, enabled: bool = True) -> None:
        pass  # the real runtime records them (see record_features)

    def features(self, start: int, end: int) -> torch.Tensor:
        assert 0 <= start <= end <= self.length
        return self._feats[start:end]

    def record_features(self, ids: list[int], layers: Any) -> None:
        self._rt.capture_features(layers)
        self._rt.rollback(0)
        with torch.inference_mode():
            self._rt.prefill(ids)
        self._feats = self._rt.features(0, len(ids)).clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, required=True, help="A finished bench folder (answers/none.jsonl).")
    ap.add_argument("--copy", default="suffix", help="The copy draft (a pure function of the context).")
    ap.add_argument("--head", default="default", help="The EAGLE head: default, or a head folder.")
    ap.add_argument("--budget", type=int, default=8, help="Nodes the copy draft may propose per step.")
    ap.add_argument("--max-head", type=int, default=3, help="Head tokens a step may add.")
    ap.add_argument("--head-weights", choices=("float32", "int8"), default=default_head_weights(),
                    help="The head's weights while drafting (default: what eagle:... drafts with here).")
    ap.add_argument("--profile", type=Path, default=None, help="Default: the model's cached --k auto profile.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/hybrid-oracle"))
    ap.add_argument("--from-records", type=Path, default=None,
                    help="Price the per-position records of an earlier run (its records.json) instead of replaying.")
    ap.add_argument("--head-ms", default=None,
                    help="With --from-records: price a head call of m tokens at these times instead of the timed ones, "
                         "e.g. 1=5.0,2=6.5,3=8.0 (what the calls cost inside a decode loop).")
    args = ap.parse_args()
    if args.head_ms is not None and args.from_records is None:
        ap.error("--head-ms reprices records: give --from-records too")
    if args.from_records is not None:
        saved = json.loads(args.from_records.read_text())
        prof = Profile.load(Path(saved["profile"]))
        head_cost = {int(m): float(v) for m, v in saved["head_seconds"].items()}
        if args.head_ms is not None:
            given = {int(m): float(ms) / 1e3 for m, _, ms in (x.partition("=") for x in args.head_ms.split(","))}
            if set(given) != set(head_cost):
                ap.error(f"--head-ms needs a time for each of m = {sorted(head_cost)}")
            head_cost = given
        finish(args, saved["turns"], head_cost, extrapolated_step_time(prof), saved["max_head"], saved["head"],
               saved["head_calls_timed"], Path(saved["profile"]))
        return
    model = load_model("default")
    profile_path = args.profile or default_profile_path(model, "auto")
    prof = Profile.load(profile_path)
    questions = {q.question_id: q for q in read_questions(DEFAULT_QUESTIONS)}
    copy = make_drafter(args.copy, model)
    assert copy is not None
    folder = default_head_folder(model) if args.head == "default" else Path(args.head)
    loaded = load_head(folder, fingerprint=fingerprint_of(model))
    shim = AtLength(model.runtime)
    head = EagleDrafter(shim, loaded, label="head", weights=args.head_weights)
    layers = loaded.head.cfg.feature_layers
    M = args.max_head
    call_seconds: dict[int, list[float]] = defaultdict(list)
    turns: list[dict[str, Any]] = []  # per turn: category, prompt length, per-position records

    step_time = extrapolated_step_time(prof)
    t0 = time.perf_counter()
    for line in (args.bench / "answers" / "none.jsonl").read_text().splitlines():
        row = json.loads(line)
        q, choice = questions[row["question_id"]], row["choices"][0]
        for t, tokens in enumerate(choice["token_ids"]):
            prompt = build_prompt(model, list(q.turns[: t + 1]), list(choice["turns"][:t]))
            shim.record_features(list(prompt) + list(tokens[:-1]), layers)
            copy.start(list(prompt), SamplingConfig(), torch.Generator())
            head.start(list(prompt), SamplingConfig(), torch.Generator())
            recs = []
            for pos in range(1, len(tokens)):
                context, truth = list(prompt) + list(tokens[:pos]), list(tokens[pos:])
                room = len(tokens) - pos - 1
                if room < 1:
                    recs.append({"copy": 0, "nodes": 0, "path": 0, "head": [0] * M, "union": [0] * M, "union_nodes": [0] * M,
                                 "scores": [0.0] * M})
                    continue
                drafted = copy.propose(context, min(args.budget, room))
                shim.length = len(context) - 1
                if pos % TIME_EVERY == 0:
                    for m in range(1, M + 1):
                        start = time.perf_counter()
                        head.propose_scored(context, m)
                        call_seconds[m].append(time.perf_counter() - start)
                guess = head.propose_scored(context, min(M, room))
                hits = 0
                for tok, true in zip(guess.tokens, truth):
                    if tok != true:
                        break
                    hits += 1
                union, union_nodes, base = [], [], trusted(drafted)
                for m in range(1, M + 1):
                    chain, scores = guess.tokens[:m], (guess.scores or ())[:m]
                    merged = merge_chain(base, chain, scores) if chain else base
                    union.append(accepted_along(merged, truth) if merged.tokens else 0)
                    union_nodes.append(len(merged.tokens))
                recs.append({
                    "copy": accepted_along(drafted, truth) if drafted.tokens else 0,
                    "nodes": len(drafted.tokens), "path": path_length(drafted) if drafted.tokens else 0,
                    "head": [min(hits, m) for m in range(1, M + 1)], "union": union, "union_nodes": union_nodes,
                    "scores": (list(guess.scores or ()) + [0.0] * M)[:M],
                })
            copy.end(answer(tokens, model.eos_token_ids))
            turns.append({"category": row["category"], "prompt": len(prompt), "recs": recs})
        print(f"{row['question_id']} ({row['category']}): {time.perf_counter() - t0:.0f} s", flush=True)
    head_cost = {m: statistics.median(v) for m, v in call_seconds.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    profile_path = Path(shutil.copy(profile_path, args.out / "profile.json"))  # the records are priced by this one
    (args.out / "records.json").write_text(json.dumps({
        "profile": str(profile_path), "head": str(folder), "max_head": M, "head_seconds": head_cost,
        "head_calls_timed": len(call_seconds[1]), "turns": turns}) + "\n")
    finish(args, turns, head_cost, step_time, M, str(folder), len(call_seconds[1]), profile_path)


def finish(args: argparse.Namespace, turns: list[dict[str, Any]], head_cost: dict[int, float], step_time: Any, M: int,
           folder: str, timed: int, profile_path: Path) -> None:
    """Price the records and write oracle.json and oracle.md."""
    result = summarize(turns, head_cost, step_time, M)
    result.update(bench=str(args.bench), copy=args.copy, head=folder, head_weights=args.head_weights, budget=args.budget,
                  head_seconds=head_cost, head_calls_timed=timed, profile=str(profile_path))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "oracle.json").write_text(json.dumps(result, indent=1) + "\n")
    text = report(result, args)
    (args.out / "oracle.md").write_text(text)
    print(text)


#: rules (fill, extra, min_score, skip_from): the head drafts up to ``fill`` tokens where the copy
#: draft proposes none and up to ``extra`` where it proposes a path shorter than ``skip_from`` (none
#: where it is longer); with ``min_score`` > 0 (a confidence cut) it stops after the first token
#: whose chain score (the product of the head's top probabilities) is below it, and that token is
#: dropped (where the copy draft has nothing, the first is always kept)
RULES = [(fill, extra, 0.0, skip) for fill in (0, 1, 2, 3) for extra in (0, 1) for skip in (0, 2, 3, 4)
         if not (extra == 0 and skip)]  # skip_from only matters where extra head tokens run
RULES += [(fill, extra, tau, skip) for fill in (1, 2, 3) for extra in (0, 1, 2, 3) for tau in (0.2, 0.35, 0.5, 0.65, 0.8)
          for skip in (0, 4) if not (extra == 0 and skip)]


def confident(scores: list[float], most: int, tau: float, keep_first: bool) -> tuple[int, int]:
    """(head tokens kept, head calls run) for a chain cut at the first score below ``tau`` (0: the
    first ``most``, every one run).

    >>> confident([0.9, 0.6, 0.3], 3, 0.5, False), confident([0.4, 0.3, 0.1], 2, 0.5, True)
    ((2, 3), (1, 1))
    """
    kept = 0
    while kept < most and scores[kept] >= tau:
        kept += 1
    calls = min(most, kept + 1)
    return (max(kept, 1) if keep_first and most else kept), calls


def summarize(turns: list[dict[str, Any]], head_cost: dict[int, float], step_time: Any, M: int) -> dict[str, Any]:
    """Per group: plain seconds, and for each policy its seconds and passes (see the module
    docstring for the two ways of pricing a step)."""
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def add(group_names: tuple[str, ...], key: str, value: float) -> None:
        for g in group_names:
            acc[g][key] += value

    for turn in turns:
        recs, P, groups = turn["recs"], turn["prompt"], (category_group(turn["category"]), "overall")
        n = len(recs) + 1  # tokens of the turn; positions 1 .. n - 1 are decoded by steps
        add(groups, "tokens", n - 1)
        add(groups, "plain_s", sum(step_time(1, P + pos) for pos in range(1, n)))

        def walk(choose: Any) -> tuple[float, int]:
            pos, seconds, passes = 1, 0.0, 0
            while pos < n:
                a, cost = choose(pos, recs[pos - 1])
                seconds, passes, pos = seconds + cost, passes + 1, pos + a + 1
            return seconds, passes

        ctx = lambda pos: P + pos  # noqa: E731 - the context length at a position
        # oracle: the copy draft alone, the head alone (m tokens), and the hybrid chosen step by step
        for name, choose in [
            ("copy", lambda pos, r: (r["copy"], step_time(r["copy"] + 1, ctx(pos)))),
            *[(f"head m={m}", lambda pos, r, m=m: (r["head"][m - 1], step_time(r["head"][m - 1] + 1, ctx(pos)) + head_cost[m]))
              for m in range(1, M + 1)],
        ]:
            s, p = walk(choose)
            add(groups, f"oracle {name} s", s)
            add(groups, f"oracle {name} passes", p)
        best = [0.0] * (n + M + 10)  # fastest way from each position to the end, with hindsight
        steps = [0] * (n + M + 10)
        for pos in range(n - 1, 0, -1):
            r = recs[pos - 1]
            options = [(step_time(r["copy"] + 1, ctx(pos)) + best[pos + r["copy"] + 1], r["copy"])]
            options += [(step_time(r["union"][m] + 1, ctx(pos)) + head_cost[m + 1] + best[pos + r["union"][m] + 1],
                         r["union"][m]) for m in range(M)]
            cost, a = min(options)
            best[pos], steps[pos] = cost, 1 + steps[pos + a + 1]
        add(groups, "oracle hybrid s", best[1])
        add(groups, "oracle hybrid passes", steps[1])
        # full: every proposed node verified; the copy draft alone and fill / extra / skip_from rules
        s, p = walk(lambda pos, r: (r["copy"], step_time(r["nodes"] + 1, ctx(pos))))
        add(groups, "full copy s", s)
        add(groups, "full copy passes", p)
        for fill, extra, tau, skip in RULES:
            def rule(pos: int, r: dict[str, Any], fill: int = fill, extra: int = extra, tau: float = tau,
                     skip: int = skip) -> tuple[int, float]:
                if r["nodes"] == 0:
                    m, calls = confident(r["scores"], fill, tau, True)
                elif skip and r["path"] >= skip:
                    m, calls = 0, 0
                else:
                    m, calls = confident(r["scores"], extra, tau, False)
                head_s = head_cost[calls] if calls else 0.0
                if m == 0:
                    return r["copy"], step_time(r["nodes"] + 1, ctx(pos)) + head_s
                return r["union"][m - 1], step_time(r["union_nodes"][m - 1] + 1, ctx(pos)) + head_s
            s, p = walk(rule)
            name = f"full fill={fill},extra={extra}," + (f"min_score={tau}," if tau else "") + f"skip_from={skip}"
            add(groups, f"{name} s", s)
            add(groups, f"{name} passes", p)
    groups_out: dict[str, Any] = {}
    for g, v in acc.items():
        out: dict[str, Any] = {"tokens": int(v["tokens"])}
        for key in v:
            if key.endswith(" s"):
                name = key[:-2]
                out[name] = {"speedup": v["plain_s"] / v[key], "mat": v["tokens"] / v[f"{name} passes"]}
        groups_out[g] = out
    return {"groups": groups_out}


def report(result: dict[str, Any], args: argparse.Namespace) -> str:
    groups = result["groups"]
    overall = groups["overall"]
    oracle = [k for k in overall if k.startswith("oracle ")]
    full = ["full copy"] + sorted((k for k in overall if k.startswith("full fill")),
                                  key=lambda k: -overall[k]["speedup"])[:6]
    head = ", ".join(f"m={m}: {s * 1e3:.1f} ms" for m, s in result["head_seconds"].items())
    lines = [f"# What a head could add to `{args.copy}`: bounds from recorded answers", "",
             f"Answers: `{args.bench}/answers/none.jsonl`; copy budget {args.budget} nodes; head `{args.head}` "
             f"in {args.head_weights} (a call of m tokens: {head}, medians of {result['head_calls_timed']} calls each, catching up one row).",
             "Cells: speedup over plain decoding (profile step times, prefill left out) / #MAT.", "",
             "**oracle**: only the accepted path is verified; `oracle hybrid` picks copy alone or copy + m head tokens "
             "per step with hindsight.", "",
             "| group | tokens | " + " | ".join(f"`{k[7:]}`" for k in oracle) + " | hybrid / copy |",
             "|---|--:|" + "--:|" * (len(oracle) + 1)]
    for g, v in groups.items():
        lines.append(f"| {g} | {v['tokens']} | " + " | ".join(f"{v[k]['speedup']:.2f}x / {v[k]['mat']:.2f}" for k in oracle)
                     + f" | {v['oracle hybrid']['speedup'] / v['oracle copy']['speedup']:.3f} |")
    lines += ["", "**full**: every proposed node is verified; rules as `fill,extra,skip_from` (the six best overall).", "",
              "| group | " + " | ".join(f"`{k[5:]}`" for k in full) + " |", "|---|" + "--:|" * len(full)]
    for g, v in groups.items():
        lines.append(f"| {g} | " + " | ".join(f"{v[k]['speedup']:.2f}x / {v[k]['mat']:.2f}" for k in full) + " |")
    def best(names: list[str]) -> str:
        top = max(names, key=lambda k: overall[k]["speedup"])
        worst = min((g for g in groups if g != "overall"), key=lambda g: groups[g][top]["speedup"] / groups[g]["full copy"]["speedup"])
        return (f"`{top[5:]}` {overall[top]['speedup'] / overall['full copy']['speedup']:.3f}x `copy` "
                f"(lowest group {worst} {groups[worst][top]['speedup'] / groups[worst]['full copy']['speedup']:.3f}x)")
    rules = [k for k in overall if k.startswith("full fill")]
    lines += ["", f"Best rule without a cut: {best([k for k in rules if 'min_score' not in k])}; "
              f"best with a cut: {best([k for k in rules if 'min_score' in k])}."]
    lines += ["", "```", f"python benchmarks/hybrid_oracle.py --bench {args.bench} --copy {args.copy} --head {args.head} "
              f"--budget {args.budget} --max-head {args.max_head} --head-weights {args.head_weights} --out {args.out}"
              + (f" --from-records {args.from_records}" if args.from_records else "")
              + (f" --head-ms {args.head_ms}" if args.head_ms else ""),
              "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
