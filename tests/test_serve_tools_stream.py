"""test_serve_tools_stream.py — tool calls in streamed `colt serve` chat answers, read by the `openai` client.

Starts the build's `colt serve` (COLT_BINARY) on tests/data/models/tiny-tool-f32 (it answers "add A B" by calling
add, "div A 0" by calling div, "mul A B" by calling a tool that is not given, "bad A B" with a call whose JSON is
broken; after a tool result it repeats it; tests/ref/make_tool_model.py) and asks each question twice, greedy:
without streaming and with "stream": true, as an agent framework asks vLLM's OpenAI server. The streamed answer,
assembled as OpenAI clients assemble it (content deltas joined; delta.tool_calls merged by index: id, type,
function.name, function.arguments pieces), must equal the non-streamed message: content, every call's name and
arguments, finish_reason ("tool_calls" with calls); the calls come as vLLM sends them (each delta naming its index,
the first of a call its id and type), the content only as deltas for text outside the calls, and with logprobs the
streamed log-probs are the non-streamed ones token for token (values within 1e-5: the prefix cache); a plain
answer with tools given too; n 2 streams each choice's call under its own choice index. What may go out before
the end (the text before anything that may begin a call) is checked in tests/test_serve_tools.c. Exits 1 on a failure, 77 when the binary or the openai package is
missing.
"""
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "data", "models", "tiny-tool-f32")
failures = 0
checks = 0


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL: " + what, flush=True)


def schema(name, description, a, b, returns):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": a},
            "b": {"type": "integer", "description": b}}, "required": ["a", "b"]},
        "return": {"type": returns}}}


# tests/data/agent/calc_tools.py's schemas as transformers' get_json_schema makes them: the prompt the model knows
TOOLS = [schema("add", "Adds two numbers.", "The first number.", "The second number.", "integer"),
         schema("div", "Divides two numbers.", "The dividend.", "The divisor.", "integer"),
         schema("slow", "Adds two numbers, slowly.", "The first number.", "The second number.", "integer"),
         schema("big", "Writes a long text.", "The first number.", "The second number.", "string")]


def start_server():
    cmd = [os.environ["COLT_BINARY"], "serve", "--model", MODEL, "--device", "cpu", "--served_model_name", "tiny",
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


def assemble(stream):
    """A streamed answer as OpenAI clients assemble it, and what the events looked like."""
    content, calls, finish, logprobs = [], {}, None, []
    n_events = content_events = 0
    for chunk in stream:
        n_events += 1
        for choice in chunk.choices:
            d = choice.delta
            if d.content:
                content.append(d.content)
                content_events += 1
            for tc in d.tool_calls or []:
                check(tc.index is not None, "a tool_calls delta without index")
                call = calls.setdefault(tc.index, {"id": None, "type": None, "name": "", "arguments": ""})
                if tc.id:
                    call["id"] = tc.id
                if tc.type:
                    call["type"] = tc.type
                if tc.function and tc.function.name:
                    call["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
            if choice.logprobs and choice.logprobs.content:
                logprobs += [(t.token, t.logprob) for t in choice.logprobs.content]
            if choice.finish_reason:
                finish = choice.finish_reason
    return {"content": "".join(content), "calls": [calls[k] for k in sorted(calls)], "finish": finish,
            "logprobs": logprobs, "events": n_events, "content_events": content_events}


def compare(client, what, messages, tools=TOOLS, logprobs=False, **extra):
    kw = dict(model="tiny", messages=messages, temperature=0, max_tokens=40)
    kw.update(extra)
    if tools is not None:
        kw["tools"] = tools
    if logprobs:
        kw["logprobs"] = True
    whole = client.chat.completions.create(**kw).choices[0]
    got = assemble(client.chat.completions.create(stream=True, **kw))
    message = whole.message
    want_calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    got_calls = [{"name": c["name"], "arguments": c["arguments"]} for c in got["calls"]]
    check(got["content"] == (message.content or ""), f"{what}: streamed content {got['content']!r}, "
                                                     f"non-streamed {message.content!r}")
    check(got_calls == want_calls, f"{what}: streamed calls {got_calls}, non-streamed {want_calls}")
    check(got["finish"] == whole.finish_reason, f"{what}: finish_reason {got['finish']} streamed, "
                                                f"{whole.finish_reason} not")
    for c in got["calls"]:
        check(c["type"] == "function" and c["id"] and c["id"].startswith("call_"),
              f"{what}: a streamed call's id {c['id']!r}, type {c['type']!r}")
    if logprobs:
        # the same tokens; the values within float rounding (the second request reads the first's K/V from
        # the prefix cache, computed in another batch shape)
        want = [(t.token, t.logprob) for t in whole.logprobs.content]
        same = len(got["logprobs"]) == len(want) and all(
            a[0] == b[0] and abs(a[1] - b[1]) <= 1e-5 for a, b in zip(got["logprobs"], want))
        check(same, f"{what}: streamed log-probs {got['logprobs']}, not {want}")
    print(f"  {what}: finish {got['finish']}, content {got['content']!r}, calls "
          f"{[c['name'] + c['arguments'] for c in got['calls']]}, {got['events']} events "
          f"({got['content_events']} with content): as the non-streamed answer")
    return got, whole


def main():
    if not os.environ.get("COLT_BINARY") or not os.path.exists(os.environ["COLT_BINARY"]):
        print("SKIP: COLT_BINARY is not a built colt")
        return 77
    try:
        import openai
    except ImportError:
        print("SKIP: the openai package is not installed")
        return 77
    proc = None
    try:
        proc, port = start_server()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
        got, _ = compare(client, "a call", user("add 3 4"))
        check(got["finish"] == "tool_calls" and len(got["calls"]) == 1 and got["calls"][0]["name"] == "add" and
              json.loads(got["calls"][0]["arguments"]) == {"a": 3, "b": 4}, f"add 3 4: {got}")
        compare(client, "a call, with log-probs", user("add 12 30"), logprobs=True)
        got, _ = compare(client, "a call of a tool that raises", user("div 8 0"))
        check(got["calls"] and got["calls"][0]["name"] == "div", f"div 8 0: {got['calls']}")
        got, _ = compare(client, "a call of a tool not given", user("mul 3 4"))
        check(got["calls"] and got["calls"][0]["name"] == "mul", f"mul 3 4: {got['calls']}")
        got, _ = compare(client, "broken call JSON", user("bad 3 4"))
        check(not got["calls"] and "<tool_call>" in got["content"] and got["finish"] == "stop",
              f"bad 3 4: the broken call is plain content: {got}")
        conversation = user("add 3 4") + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_x", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
            {"role": "tool", "tool_call_id": "call_x", "content": "7"}]
        got, _ = compare(client, "after the tool result", conversation, logprobs=True)
        check(got["content"] == "7" and got["finish"] == "stop" and not got["calls"], f"the answer after 7: {got}")
        got, _ = compare(client, "tool_choice none", user("add 3 4"), tool_choice="none")
        check("<tool_call>" in got["content"] and not got["calls"], f"tool_choice none: {got}")
        # a plain answer with tools given: given a long result the model writes digits (and braces: only '<'
        # may begin a call), which go out as they come (how many deltas depends on timing: test_serve_tools
        # checks what may be sent before the end)
        long_result = conversation[:2] + [{"role": "tool", "tool_call_id": "call_x", "content": "9876543210123"}]
        got, whole = compare(client, "a plain answer", long_result)
        check(len(got["content"]) > 3 and not got["calls"] and "<" not in got["content"], f"a plain answer: {got}")
        n = client.chat.completions.create(model="tiny", messages=user("add 5 6"), tools=TOOLS, temperature=0,
                                           max_tokens=40, n=2, stream=True)
        per_choice = {}
        for chunk in n:
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or []:
                    per_choice.setdefault(choice.index, []).append(tc.function.name)
        check(per_choice == {0: ["add"], 1: ["add"]}, f"n 2: the calls by choice {per_choice}")
        print(f"  n 2: each choice's call streamed under its own index: {per_choice}")
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
    print(f"test_serve_tools_stream: {checks - failures}/{checks} checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
