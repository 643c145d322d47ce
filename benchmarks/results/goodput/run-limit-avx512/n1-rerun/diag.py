"""N = 1 plain: in-process generate vs the server (streaming and not), same prompts, greedy, 128 tokens."""
import json, statistics, subprocess, sys, time, os
import httpx
from draftwise.questions import DEFAULT_QUESTIONS, read_questions

qs = read_questions(DEFAULT_QUESTIONS)[:6]
prompts = [q.turns[0] if hasattr(q, "turns") else q["turns"][0] for q in qs]
mode = sys.argv[1]
out = {}
if mode == "inproc":
    from draftwise.loaders import load_model
    from draftwise.api import generate
    m = load_model("default")
    generate(m, "hi", draft="none", max_new_tokens=8)
    rows = []
    for r in range(2):
        for p in prompts:
            g = generate(m, p, draft="none", max_new_tokens=128)
            rows.append((g.new_tokens, g.seconds, g.prefill_seconds))
    tok = sum(r[0] for r in rows); sec = sum(r[1] for r in rows); pre = sum(r[2] for r in rows)
    print(f"inproc: {tok / sec:.1f} tok/s; decode {1000 * (sec - pre) / tok:.1f} ms/token; prefill {pre:.2f}s")
else:
    port = 8799
    srv = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "draftwise"), "serve", "--port", str(port), "--max-batch", "1"],
                           stdout=open("/tmp/exp/srv.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    res = {"stream": [], "plain": []}
    with httpx.Client(timeout=120) as c:
        body0 = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0, "speculative": {"draft": "none"}}
        c.post(url + "/v1/chat/completions", json=body0)
        for r in range(2):
            for i, p in enumerate(prompts):
                order = ("stream", "plain") if (i + r) % 2 == 0 else ("plain", "stream")
                for how in order:
                    body = {"messages": [{"role": "user", "content": p}], "max_tokens": 128, "temperature": 0,
                            "speculative": {"draft": "none"}, "stream": how == "stream"}
                    t0 = time.perf_counter()
                    final = None
                    if how == "stream":
                        with c.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                            for line in resp.iter_lines():
                                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                                    ch = json.loads(line[5:])
                                    if ch.get("choices") and ch["choices"][0].get("finish_reason"):
                                        final = ch
                    else:
                        final = c.post(url + "/v1/chat/completions", json=body).json()
                    e2e = time.perf_counter() - t0
                    res[how].append((final["usage"]["completion_tokens"], e2e, final["timings"]["prompt_ms"] / 1000,
                                     final["timings"]["predicted_ms"] / 1000))
    srv.terminate(); srv.wait()
    for how, rows in res.items():
        tok = sum(r[0] for r in rows); e2e = sum(r[1] for r in rows); pre = sum(r[2] for r in rows); dec = sum(r[3] for r in rows)
        print(f"server {how}: {tok / e2e:.1f} tok/s e2e; server decode {1000 * dec / tok:.1f} ms/token; prefill {pre:.2f}s")
