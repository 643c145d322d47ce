"""In-process N = 16 (issue 27, the trace behind run 32): 32 dev first turns on a 16-slot engine,
no server, 128 tokens each; phases plain, suffix k = 1 and the goodput policy (suffix, k auto);
per phase wall seconds, seconds in passes and outside them, and, for the policy, the draft tokens
it expected of the steps where it kept a proposal against those accepted. Each pass's shape is
written to /tmp/ovh/trace-MODE-I.json (make the folder first).

    mkdir -p /tmp/ovh; python in_process.py suffix plain,k1,goodput [--prof]

Ran 2026-12-05 19:14-19:21 UTC at commit 361c358 (before the policy measured anything), one model
process, nothing else running. Read: plain 171.3 tok/s, 0.41 s of 21.0 outside the passes (258
passes, about 14 sequences each: 0.11 ms a sequence); k = 1 157.6, 0.64 s; goodput 158.3, 0.87 s
(again: 153.0, 1.04 s), its suffix steps 769 with 1,164 draft tokens expected and 935 accepted
(0.80). Experiments with fixed values, not the shipped code: ``OVH=plain_ms,spec_ms`` replaces the
step cost's per-sequence overhead (0.11,0.9: goodput 155.9 and 157.7 against plain 175.6);
``CAL=f`` scales the expected draft tokens (0.76 with OVH: 161.4 against 175.2). In this closed
batch (two waves of 16, every answer 128 tokens) the accepted tokens barely shorten the phase,
which the slowest slot ends.
"""
import sys, time, glob, cProfile, pstats, io, json
from draftwise.loaders import load_model
from draftwise.engine import Engine
from draftwise.chat import encode_conversation
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions
from draftwise.drafters.factory import make_drafter
from draftwise.cost.adaptive import AdaptiveK, resolve_profile
from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path
from draftwise.cost.goodput_policy import BatchGoodput, BatchKCoordinator

model = load_model("default")
qs = spread_questions(read_questions(DEFAULT_QUESTIONS), 32)
prompts = [encode_conversation(model.tokenizer, q.turns[:1], chat=True) for q in qs]
engine = Engine(model, max_batch=16, context=2048)
prof = resolve_profile(model, ["lookup", "suffix"])
bp = BatchProfile.load(default_batch_profile_path(model))
draft = sys.argv[1] if len(sys.argv) > 1 else "suffix"
mode_list = sys.argv[2].split(",") if len(sys.argv) > 2 else ["plain", "k1", "goodput", "plain", "k1", "goodput"]
do_prof = "--prof" in sys.argv
import os
if os.environ.get("OVH"):
    import draftwise.cost.goodput as g
    plain_s, spec_s = (float(x) / 1e3 for x in os.environ["OVH"].split(","))
    def overhead(self, k, context):
        return spec_s if k else plain_s
    g.StepCost.overhead = overhead

def phase(mode):
    base = make_drafter(draft, model)
    drafters = None if mode == "plain" else [make_drafter(draft, m, share_with=base) for m in engine.slot_models]
    if mode == "plain":
        k = 1
    elif mode == "k1":
        k = 1
    else:
        coord = BatchKCoordinator(BatchGoodput(bp, prof), epoch=lambda: engine.stats.passes)
        cap = drafters[0].capabilities
        k = lambda: coord.policy(AdaptiveK(prof, draft, capabilities=cap), draft)
    engine.stats.trace = []
    p0, s0 = engine.stats.passes, engine.stats.seconds
    t0 = time.perf_counter()
    res = engine.generate_all(prompts, max_new_tokens=128, drafters=drafters, k=k)
    wall = time.perf_counter() - t0
    json.dump(engine.stats.trace, open(f'/tmp/ovh/trace-{mode}-{len(traces)}.json', 'w')); traces.append(mode)
    toks = sum(len(r.token_ids) for r in res)
    return dict(mode=mode, wall=wall, passes=engine.stats.passes - p0, pass_s=engine.stats.seconds - s0,
                tokens=toks, tok_s=toks / wall, outside_s=wall - (engine.stats.seconds - s0)), res

engine.generate_all(prompts[:16], max_new_tokens=8)  # warm
import draftwise.cost.goodput_policy as gp
stat = {"steps": 0, "spec": 0, "exp": 0.0, "acc": 0, "pending": {}}
_trim, _obs, _resp = gp.BatchSlotPolicy.trim, gp.BatchSlotPolicy.observe, gp.BatchGoodput.respond
CAL = float(os.environ.get("CAL", "1"))
def resp(self, index, tokens, context):
    tokens = [1 + (t - 1) * CAL for t in tokens]
    n = _resp(self, index, tokens, context)
    stat["last"] = (n, tokens[n] - 1)
    return n
def trim(self, draft, ctx):
    stat["last"] = None
    kept = _trim(self, draft, ctx)
    if stat["last"] is not None and len(kept):
        stat["pending"][id(self)] = (len(kept), stat["last"][1] if stat["last"][0] == len(kept) else None)
    return kept
def obs(self, positions, accepted):
    p = stat["pending"].pop(id(self), None)
    stat["steps"] += 1
    if p is not None and p[1] is not None:
        stat["spec"] += 1; stat["exp"] += p[1]; stat["acc"] += accepted
    return _obs(self, positions, accepted)
gp.BatchGoodput.respond, gp.BatchSlotPolicy.trim, gp.BatchSlotPolicy.observe = resp, trim, obs
out = []
traces = []
ref = None
for mode in mode_list:
    if do_prof and mode == "goodput":
        pr = cProfile.Profile(); pr.enable()
    r, res = phase(mode)
    if do_prof and mode == "goodput":
        pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue())
    ids = [x.token_ids for x in res]
    r["equal"] = ref is None or ids == ref
    ref = ref or ids
    print({k: v for k, v in stat.items() if k != 'pending'})
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
