"""Greedy answers (token ids) of dev questions, for offline replays of copy drafts: the first 8
of each single-turn category and the first 3 of each MT-bench category (both turns), decoded
with lookup at k=8 (greedy: the same tokens as plain decoding). From the repository root:

    python benchmarks/results/planner/copy-union/answers.py benchmarks/results/planner/copy-union/answers.jsonl
"""
import json, sys, time
from draftwise.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, read_questions
from draftwise.chat import encode_conversation
from draftwise.drafters import make_drafter
from draftwise.cost.replay import trace_generation, answer, answer_text

single_take = range(0, 8)
mt_take = range(0, 3)
out = open(sys.argv[1], "w")
model = load_model("default")
qs = read_questions(DEFAULT_QUESTIONS)
seen = {}
rows = []
for q in qs:
    i = seen.get(q.category, 0); seen[q.category] = i + 1
    if (i in single_take and len(q.turns) == 1) or (i in mt_take and len(q.turns) > 1):
        rows.append(q)
print(len(rows), "questions", flush=True)
t0 = time.time()
for n, q in enumerate(rows):
    answers = []
    for turn in range(len(q.turns)):
        ids = encode_conversation(model.tokenizer, q.turns[: turn + 1], answers)
        tr = trace_generation(model, ids, make_drafter("lookup", model), 8, 128)
        out.write(json.dumps({"qid": q.question_id, "category": q.category, "turn": turn, "prompt": ids,
                              "tokens": tr.tokens, "eos": tr.tokens[-1] in model.eos_token_ids}) + "\n"); out.flush()
        answers.append(answer_text(model.tokenizer, answer(tr.tokens, model.eos_token_ids)))
    print(n, q.category, round(time.time() - t0), flush=True)
