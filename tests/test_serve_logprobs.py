"""test_serve_logprobs.py — colt serve's echo and top log-probs through the `openai` client, against transformers.

Starts the build's `colt serve` (COLT_BINARY) on stories260K (a copy with a chat template) on a free
port and asks it what evaluation harnesses ask vLLM's OpenAI server. The goldens
(tests/data/serve_logprob_goldens.json, from tests/ref/make_serve_logprob_goldens.py) are
transformers' log_softmax and top-3 at every position of prompt + greedy continuation:
  - echo with max_tokens 0 and logprobs 3 (a batch of id prompts, as lm-eval sends them): the
    prompt's text, its tokens, token_logprobs (the first null), top_logprobs dicts (the token's own
    entry and the top 3), text_offset;
  - greedy with logprobs 3: the continuation's ids, log-probs and alternatives; with echo, both;
  - lm-eval's log-likelihood request (echo, max_tokens 1, logprobs 1) read by lm-eval's own
    parse_logprobs when lm_eval is installed;
  - chat with logprobs true and top_logprobs 3;
  - greedy with logit_bias, repetition, frequency and presence penalties equal to transformers' greedy
    with the same processors in vLLM's order;
  - a stop string with echo and log-probs; refused combinations (400).
Exits 1 on a failure, 77 when the binary or the openai package is missing.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "stories260K")
GOLDENS = os.path.join(ROOT, "tests", "data", "serve_logprob_goldens.json")
TOL = 1e-4  # fp32 forward (colt, one chunk of positions) against transformers' fp32, log-softmax in double
failures = 0
checks = 0


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL: " + what, flush=True)


def close(a, b):
    return a is not None and b is not None and abs(a - b) <= TOL


def start_server(model_dir):
    cmd = [os.environ["COLT_BINARY"], "serve", "--model", model_dir, "--served_model_name", "stories",
           "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port, lines = None, []
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "listening on http://" in line:
            port = int(line.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1].rstrip("/"))
            break
    if port is None:
        proc.kill()
        sys.exit("colt serve did not start:\n" + "".join(lines))
    log = list(lines)
    drain = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)  # keep its pipe drained
    drain.start()
    proc.log, proc.drain = log, drain
    return proc, port


def check_tops(top, token_id, token_lp, gold_ids, gold_lps, where):
    """A completions top_logprobs dict: the token's own entry plus the golden top-k (k or k + 1 entries)."""
    values = sorted(top.values(), reverse=True)
    want = sorted(list(gold_lps) + ([] if token_id in gold_ids else [token_lp]), reverse=True)
    check(len(values) == len(want), f"{where}: {len(values)} alternatives, want {len(want)}")
    worst = max((abs(a - b) for a, b in zip(values, want)), default=0.0)
    check(worst <= TOL, f"{where}: top log-probs {values} vs transformers {want}")
    return worst


def check_completion_logprobs(lp, g, start, end, where):
    """lp (a completions logprobs object) holds positions [start, end) of golden case g."""
    ids = g["prompt_ids"] + g["completion_ids"]
    n = end - start
    check(len(lp.tokens) == n and len(lp.token_logprobs) == n and len(lp.top_logprobs) == n and
          len(lp.text_offset) == n, f"{where}: {len(lp.tokens)} tokens, want {n}")
    worst = 0.0
    for i, t in enumerate(range(start, min(end, start + len(lp.token_logprobs)))):
        if t == 0:
            check(lp.token_logprobs[i] is None and lp.top_logprobs[i] is None,
                  f"{where}: the first prompt token's log-probs are not null")
            continue
        check(close(lp.token_logprobs[i], g["logprobs"][t]),
              f"{where}: position {t} (id {ids[t]}): log-prob {lp.token_logprobs[i]} vs {g['logprobs'][t]}")
        if lp.token_logprobs[i] is not None:
            worst = max(worst, abs(lp.token_logprobs[i] - g["logprobs"][t]))
            worst = max(worst, check_tops(lp.top_logprobs[i], ids[t], g["logprobs"][t], g["top_ids"][t],
                                          g["top_logprobs"][t], f"{where}: position {t}"))
    offsets = [0]
    for tok in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(tok))
    check(list(lp.text_offset) == offsets, f"{where}: text_offset {lp.text_offset}, want {offsets}")
    return worst


def main():
    binary = os.environ.get("COLT_BINARY")
    if not binary or not os.path.exists(binary):
        print("SKIPPED: COLT_BINARY not set to a built colt")
        return 77
    try:
        import openai
    except ImportError:
        print("SKIPPED: the openai package is not installed")
        return 77
    with open(GOLDENS) as f:
        gold = json.load(f)
    k = gold["k"]
    tmp = tempfile.mkdtemp(prefix="colt_serve_logprobs_")
    proc = None
    try:
        model = os.path.join(tmp, "model")
        shutil.copytree(MODEL, model)
        with open(os.path.join(model, "chat_template.jinja"), "w") as f:
            f.write(gold["chat_template"])
        proc, port = start_server(model)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120, max_retries=0)
        cases = gold["completions"]
        worst = 0.0

        # echo, max_tokens 0, logprobs k over a batch of id prompts: the prompts' own scores
        r = client.completions.create(model="stories", prompt=[c["prompt_ids"] for c in cases], max_tokens=0,
                                      echo=True, logprobs=k, temperature=0)
        check(len(r.choices) == len(cases), f"echo batch: {len(r.choices)} choices")
        for ch in sorted(r.choices, key=lambda c: c.index):
            c = cases[ch.index]
            n = len(c["prompt_ids"])
            worst = max(worst, check_completion_logprobs(ch.logprobs, c, 0, n, f"echo max_tokens 0, prompt {ch.index}"))
            check(ch.text == c["prompt_ids_text"], f"echo text {ch.text!r}, want {c['prompt_ids_text']!r}")
        check(r.usage.completion_tokens == 0, f"max_tokens 0 generated {r.usage.completion_tokens} tokens")

        # greedy with logprobs k: the continuation; then with echo: prompt and continuation
        for i, c in enumerate(cases):
            n = len(c["prompt_ids"])
            m = len(c["completion_ids"])
            r = client.completions.create(model="stories", prompt=c["prompt"], max_tokens=m, temperature=0,
                                          logprobs=k, extra_body={"return_token_ids": True})
            ch = r.choices[0]
            got = getattr(ch, "token_ids", None) or (ch.model_extra or {}).get("token_ids")
            check(got == c["completion_ids"], f"greedy prompt {i}: ids {got}, transformers {c['completion_ids']}")
            worst = max(worst, check_completion_logprobs(ch.logprobs, c, n, n + m, f"greedy prompt {i}"))
            check("".join(ch.logprobs.tokens) == ch.text, f"greedy prompt {i}: tokens {ch.logprobs.tokens} do not "
                  f"spell the text {ch.text!r}")
            r = client.completions.create(model="stories", prompt=c["prompt"], max_tokens=m, temperature=0,
                                          logprobs=k, echo=True)
            ch = r.choices[0]
            worst = max(worst, check_completion_logprobs(ch.logprobs, c, 0, n + m, f"greedy echo prompt {i}"))
            check(ch.text.startswith(c["prompt"]) and len(ch.text) > len(c["prompt"]),
                  f"greedy echo prompt {i}: text {ch.text!r}")

        # lm-eval's log-likelihood request, read by lm-eval's own parser
        body = dict(model="stories", prompt=[c["prompt_ids"] for c in cases], temperature=0, max_tokens=1,
                    logprobs=1, seed=1234, echo=True)
        raw = client.completions.create(**body).model_dump()
        try:
            from lm_eval.models.openai_completions import LocalCompletionsAPI
            ctxlens = [len(c["prompt_ids"]) - 2 for c in cases]  # the last two prompt tokens as the continuation
            parsed = LocalCompletionsAPI.parse_logprobs(raw, ctxlens=ctxlens)
            for (ll, greedy), c, cl in zip(parsed, cases, ctxlens):
                want = sum(c["logprobs"][cl:len(c["prompt_ids"])])
                want_greedy = all(c["top_ids"][t][0] == c["prompt_ids"][t] for t in range(cl, len(c["prompt_ids"])))
                check(abs(ll - want) <= 2 * TOL and greedy == want_greedy,
                      f"lm-eval parse_logprobs: ({ll}, {greedy}), transformers ({want}, {want_greedy})")
        except ImportError:
            print("SKIPPED: lm-eval's parse_logprobs (lm_eval not installed)")

        # chat: logprobs true, top_logprobs k
        c = gold["chat"]
        r = client.chat.completions.create(model="stories", messages=c["messages"], max_tokens=len(c["completion_ids"]),
                                           temperature=0, logprobs=True, top_logprobs=k,
                                           extra_body={"return_token_ids": True})
        ch = r.choices[0]
        extra = ch.model_extra or {}
        check(extra.get("prompt_token_ids") == c["prompt_ids"],
              f"chat prompt ids {extra.get('prompt_token_ids')}, transformers {c['prompt_ids']}")
        check(extra.get("token_ids") == c["completion_ids"],
              f"chat completion ids {extra.get('token_ids')}, transformers {c['completion_ids']}")
        n = len(c["prompt_ids"])
        content = ch.logprobs.content
        check(len(content) == len(c["completion_ids"]), f"chat: {len(content)} log-prob entries")
        for j, e in enumerate(content):
            t = n + j
            check(close(e.logprob, c["logprobs"][t]), f"chat token {j}: {e.logprob} vs {c['logprobs'][t]}")
            got = [a.logprob for a in e.top_logprobs]
            check(len(got) == k and all(close(a, b) for a, b in zip(got, c["top_logprobs"][t])),
                  f"chat token {j}: top log-probs {got} vs {c['top_logprobs'][t]}")
            check(bytes(e.bytes).decode("utf-8", "replace") == e.token, f"chat token {j}: bytes do not spell it")
            worst = max([worst, abs(e.logprob - c["logprobs"][t])] + [abs(a - b) for a, b in zip(got, c["top_logprobs"][t])])

        # a stop string with echo and log-probs: the text cut, every token it had scored
        c = cases[0]
        r = client.completions.create(model="stories", prompt=c["prompt"], max_tokens=12, temperature=0, logprobs=2,
                                      echo=True, stop=[" was"])
        ch = r.choices[0]
        check(ch.finish_reason == "stop" and " was" not in ch.text[len(c["prompt"]):],
              f"stop string: {ch.finish_reason} {ch.text!r}")
        lp = ch.logprobs
        check(len(lp.tokens) > len(c["prompt_ids"]) and all(v is not None for v in lp.token_logprobs[1:]),
              "stop string: the completion's tokens have no log-probs")

        # vLLM's penalties and logit bias: greedy equal to transformers with the same processors
        c = gold["penalised"]
        r = client.completions.create(model="stories", prompt=c["prompt"], max_tokens=c["max_tokens"], temperature=0,
                                      frequency_penalty=c["frequency_penalty"], presence_penalty=c["presence_penalty"],
                                      logit_bias=c["logit_bias"],
                                      extra_body={"repetition_penalty": c["repetition_penalty"],
                                                  "return_token_ids": True})
        got = (r.choices[0].model_extra or {}).get("token_ids")
        check(got == c["completion_ids"], f"penalised greedy: ids {got}, transformers {c['completion_ids']}")
        check(c["completion_ids"] != c["unpenalised_ids"], "the penalties change nothing in the golden")
        print(f"  greedy with logit_bias, repetition, frequency and presence penalties: {len(got or [])} tokens, "
              f"{'equal to' if got == c['completion_ids'] else 'DIFFERENT from'} transformers' (the unpenalised "
              f"completion differs from token {next(i for i, (a, b) in enumerate(zip(c['completion_ids'], c['unpenalised_ids'])) if a != b)})")

        # refused combinations: one 400 naming the parameter each
        refused = [dict(prompt="Hi", echo=True, logprobs=1, stream=True),
                   dict(prompt="Hi", max_tokens=0),
                   dict(prompt="Hi", logprobs=21),
                   dict(prompt="Hi", presence_penalty=2.5),
                   dict(prompt="Hi", logit_bias={"99999": 1}),
                   dict(prompt="Hi", logit_bias={"x": 1})]
        for body in refused:
            try:
                client.completions.create(model="stories", **body)
                check(False, f"{body} was accepted")
            except openai.BadRequestError as e:
                check(e.status_code == 400, f"{body}: status {e.status_code}")
        try:
            client.chat.completions.create(model="stories", messages=c and gold["chat"]["messages"], top_logprobs=2)
            check(False, "chat top_logprobs without logprobs was accepted")
        except openai.BadRequestError as e:
            check("logprobs" in str(e), f"chat top_logprobs without logprobs: {e}")
        print(f"  echo / logprobs {k} / chat top_logprobs {k} against transformers: worst |diff| {worst:.2g} "
              f"(limit {TOL})")
    finally:
        if proc:
            proc.terminate()
            try:
                code = proc.wait(timeout=60)
                proc.drain.join(timeout=10)
                text = "".join(proc.log)
                report = any(w in text for w in ("AddressSanitizer", "LeakSanitizer", "runtime error:"))
                check(code == 0 and not report, f"colt serve exited {code} after SIGTERM; its log:\n{text[-4000:]}")
            except subprocess.TimeoutExpired:
                proc.kill()
                check(False, "colt serve did not exit within 60 s of SIGTERM")
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_serve_logprobs: {checks - failures}/{checks} checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
