"""At temperature 0.7, is a k=1 prediction off in acceptance or in price? On the first dev question
of the given categories (first turn, 96 tokens), for each draft and seed: plain decoding, the
draft at k=1 and at k=8, each timed and priced with the cached profile (``price_parts``), and
the k=1 steps the planner would replay on the k=8 run's tokens (``k1_from8``). Writes
k1diag.json beside this file; ``summary.md`` has the figures.

    python benchmarks/results/planner/k1-diag/k1diag.py math,stem,rag,qa,reasoning 2 benchmarks/results/planner/k1-diag/profile.json
"""
import json
import sys
from pathlib import Path

from draftwise import load_model
from draftwise.questions import read_questions, DEFAULT_QUESTIONS
from draftwise.chat import encode_conversation
from draftwise.cost.profile import Profile
from draftwise.cost.replay import price_parts, replay_lookup, trace_generation
from draftwise.drafters.factory import make_drafter
from draftwise.sampling import SamplingConfig
from draftwise.cost.plan import warm_up

model = load_model("default")
prof = Profile.load(sys.argv[3]) if len(sys.argv) > 3 else None
if prof is None:
    from draftwise.cost.profile import default_profile_path
    prof = Profile.load(default_profile_path(model))
qs = read_questions(DEFAULT_QUESTIONS)
cats = sys.argv[1].split(",")
seeds = int(sys.argv[2])
rows = [next(q for q in qs if q.category == c) for c in cats]
warm_up(model)
out = []
for d in ("suffix", "lookup"):
  for s in range(seeds):
    drafters = {k: make_drafter(d, model) for k in (1, 8)}
    rdr = make_drafter(d, model)
    for row in rows:
        ids = encode_conversation(model.tokenizer, row.turns[:1], [])
        rec = {"draft": d, "cat": row.category, "seed": s}
        for k in (0, 1, 8):
            cfg = SamplingConfig(temperature=0.7, seed=1000 + s + 7 * k)
            dr = None if k == 0 else drafters[k]
            tr = trace_generation(model, ids, dr, 1 if k == 0 else k, 96, sampling=cfg)
            parts = price_parts(prof, "none" if k == 0 else d, tr.steps, tr.prompt_len, tr.prefill_seconds, len(tr.tokens), sampled=True)
            n = len(tr.tokens)
            rec[f"k{k}"] = {"s": tr.seconds, "pred": sum(parts), "parts": parts, "n": n, "steps": len(tr.steps),
                            "prop": sum(1 for m, _ in tr.steps if m), "acc": sum(a for _, a in tr.steps), "trace": tr.steps}
            if k == 8:  # what the plan would predict for k=1 from this k=8 trace (replay on its tokens)
                st = replay_lookup(rdr, ids, tr.tokens, 1, 96, eos_token_ids=model.eos_token_ids)
                rec["k1_from8"] = {"steps": len(st), "prop": sum(1 for m, _ in st if m), "acc": sum(a for _, a in st), "n": n,
                                   "pred": sum(price_parts(prof, d, st, tr.prompt_len, tr.prefill_seconds, n, sampled=True))}
        out.append(rec)
        r = rec
        print(d, row.category, s, "plain %.2fs/%d pred %.2f | k1 %.2fs/%d pred %.2f steps %d prop %d acc %d | from8: steps %d prop %d acc %d tok/step %.3f vs k1 %.3f" % (
            r["k0"]["s"], r["k0"]["n"], r["k0"]["pred"], r["k1"]["s"], r["k1"]["n"], r["k1"]["pred"], r["k1"]["steps"], r["k1"]["prop"], r["k1"]["acc"],
            r["k1_from8"]["steps"], r["k1_from8"]["prop"], r["k1_from8"]["acc"], r["k1_from8"]["n"]/max(1,r["k1_from8"]["steps"]), r["k1"]["n"]/max(1,r["k1"]["steps"])), flush=True)
json.dump(out, open(Path(__file__).with_name("k1diag.json"), "w"))
