"""benchmarks/load_test.py's prompt mix and per-category table (no server, no model)."""

from __future__ import annotations

import pytest

from draftwise.questions import Question

from .benchmark_scripts import load_benchmark

pytest.importorskip("httpx")
load_test = load_benchmark("load_test")


def _questions() -> list[Question]:
    return [Question(1, "writing", ("w1a", "w1b")), Question(2, "writing", ("w2a", "w2b")),
            Question(3, "qa", ("q3",)), Question(4, "qa", ("q4",))]


def test_the_mix_asks_first_turns_then_second_turns_and_never_repeats():
    prompts = load_test.make_prompts(_questions(), 6)
    assert [(p["question_id"], p["turn"]) for p in prompts] == [(1, 1), (3, 1), (2, 1), (4, 1), (1, 2), (2, 2)]
    assert prompts[4]["users"] == ["w1a", "w1b"]
    assert len({(p["question_id"], p["turn"]) for p in prompts}) == len(prompts)
    assert [p["turn"] for p in load_test.make_prompts(_questions(), 3)] == [1, 1, 1]


def test_more_prompts_than_the_questions_give_is_refused():
    with pytest.raises(SystemExit, match="only 6 distinct prompts"):
        load_test.make_prompts(_questions(), 7)


def test_a_second_turn_carries_the_first_answer_as_the_assistant_message():
    p = {"users": ["first?", "second?"], "answers": ["answer one"]}
    assert load_test.messages(p) == [{"role": "user", "content": "first?"},
                                     {"role": "assistant", "content": "answer one"},
                                     {"role": "user", "content": "second?"}]


def test_per_category_speed_is_tokens_over_server_seconds():
    rec = {"category": "qa", "tokens": 60, "prefill_s": 0.5, "draft": "lookup", "mat": 2.0}
    records = [dict(rec, mode="none", decode_s=2.5, mat=1.0, draft="none"), dict(rec, mode="auto", decode_s=1.0),
               {"category": "qa", "mode": "auto", "error": "HTTP 500"}]  # failed: no decode_s, not counted
    (row,) = load_test.by_category(records)
    assert row["none_tps"] == pytest.approx(20.0) and row["auto_tps"] == pytest.approx(40.0)
    assert row["speedup"] == pytest.approx(2.0) and row["draft"] == "lookup" and row["requests"] == 1


def test_each_client_sends_its_units_turns_one_after_the_other(monkeypatch):
    import asyncio

    sent = []

    async def fake(client, url, prompt, mode, max_tokens, client_id, k_auto):
        sent.append((client_id, prompt["question_id"], prompt["turn"]))
        await asyncio.sleep(0)
        return {"client": client_id, "question_id": prompt["question_id"]}

    monkeypatch.setattr(load_test, "one_request", fake)
    units = [[{"question_id": q, "turn": t} for t in (1, 2)[: 2 if q % 2 else 1]] for q in range(4)]
    recs, _ = asyncio.run(load_test.phase("http://x", units, "none", 2, 2, 8, False))
    assert len(recs) == 6
    for c in (0, 1):  # client c takes units 2c and 2c + 1, a unit's turns in order
        mine = [(q, t) for cid, q, t in sent if cid == c]
        assert mine == [(q, t) for q in (2 * c, 2 * c + 1) for t in (1, 2)[: 2 if q % 2 else 1]]
    sent.clear()  # the clients take the units an assignment names (every N the same units)
    recs, _ = asyncio.run(load_test.phase("http://x", units, "none", 2, 2, 8, False, assignment=[[0, 2, 3], [1]]))
    assert len(recs) == 6
    assert [(q, t) for cid, q, t in sent if cid == 0] == [(0, 1), (2, 1), (3, 1), (3, 2)]
    assert [(q, t) for cid, q, t in sent if cid == 1] == [(1, 1), (1, 2)]


def test_per_request_speed_is_each_request_s_tokens_over_its_latency():
    recs = [{"error": None, "lost": False, "tokens": 60, "e2e": 2.0, "ttft": 0.1, "prefill_s": 0.1, "mat": 1.0},
            {"error": None, "lost": False, "tokens": 20, "e2e": 2.0, "ttft": 0.1, "prefill_s": 0.1, "mat": 1.0}]
    s = load_test.summarize(recs, 4.0)
    assert s["tokens_per_s"] == pytest.approx(20.0) and s["per_request_tps"] == pytest.approx(20.0)


def test_a_later_turn_s_history_is_the_earlier_answer_as_bench_gives_it(tiny_chat_folder):
    from draftwise import load_model
    from draftwise.runtime.chat import encode_conversation
    from draftwise.planner.replay import answer, answer_text

    prompts = [{"question_id": 1, "category": "writing", "turn": 2, "users": ["Hi there.", "And again?"]},
               {"question_id": 1, "category": "writing", "turn": 1, "users": ["Hi there."]}]
    load_test.references(str(tiny_chat_folder), prompts, 6)
    model = load_model(str(tiny_chat_folder))
    second, first = prompts
    assert first["answers"] == [] and len(first["reference"]) <= 6
    assert second["answers"] == [answer_text(model.tokenizer, answer(first["reference"], model.eos_token_ids))]
    ids = encode_conversation(model.tokenizer, second["users"], second["answers"], chat=True)
    assert second["prompt_tokens"] == len(ids) > first["prompt_tokens"]
