"""lm_eval_serve.py — lm-evaluation-harness against `colt serve`, compared with lm-eval's own `hf` model.

Runs two tasks defined over local JSONL files (tests/data/lm_eval: a multiple-choice log-likelihood
task and a generate_until task) twice on the same checkpoint:
  - lm-eval's `local-completions` model talking to a `colt serve` this script starts (echo + logprobs
    requests for the log-likelihoods, greedy completions with stop strings for the generations);
  - lm-eval's `hf` model (transformers, fp32, CPU).
and compares every metric and every per-sample answer: each choice's log-likelihood (within TOL) and
greedy flag, each generation's text. Exits 1 when they differ, 0 when they agree.

    python3 bench/lm_eval_serve.py [--colt build/colt] [--model models/stories260K]

Needs `pip install lm-eval` (and transformers, torch). Takes ~1 minute on 2 cores (stories260K).
"""
import argparse
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ["colt_stories_mc", "colt_stories_gen"]
TOL = 1e-4  # colt's fp32 forward against transformers' fp32: summed log-probs of a few tokens


def start_server(colt, model):
    proc = subprocess.Popen([colt, "serve", "--model", model, "--served_model_name", "colt", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, lines = time.time() + 60, []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "listening on http://" in line:
            port = int(line.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1].rstrip("/"))
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, port
    proc.kill()
    sys.exit("colt serve did not start:\n" + "".join(lines))


def evaluate(model_type, model_args):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    t0 = time.time()
    out = simple_evaluate(model=model_type, model_args=model_args, tasks=TASKS, batch_size=1, log_samples=True,
                          task_manager=TaskManager(include_path=os.path.join(ROOT, "tests", "data", "lm_eval")))
    return out, time.time() - t0


def per_sample(out, task):
    """doc id -> the filtered responses: (log-likelihood, greedy) per choice, or the generated text."""
    return {s["doc_id"]: s["filtered_resps"] for s in out["samples"][task]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--colt", default=os.path.join(ROOT, "build", "colt"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K"))
    a = ap.parse_args()
    os.chdir(ROOT)  # the task files name their data relative to the repository
    proc, port = start_server(a.colt, a.model)
    try:
        served, t_served = evaluate("local-completions",
                                    f"model=colt,base_url=http://127.0.0.1:{port}/v1/completions,tokenizer={a.model},"
                                    "tokenizer_backend=huggingface,add_bos_token=True,num_concurrent=1,max_retries=1,"
                                    "max_length=512")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    hf, t_hf = evaluate("hf", f"pretrained={a.model},dtype=float32,device=cpu,add_bos_token=True")

    failures = 0
    print(f"{'task':<18} {'metric':<14} {'colt serve':>11} {'hf':>11}")
    for task in TASKS:
        for key, value in sorted(hf["results"][task].items()):
            if not isinstance(value, float) or "stderr" in key:
                continue
            got = served["results"][task].get(key)
            ok = got is not None and abs(got - value) <= 1e-9
            failures += not ok
            print(f"{task:<18} {key:<14} {got:>11.4f} {value:>11.4f}{'' if ok else '  DIFFERENT'}")
    worst, n_ll, n_gen, same_gen = 0.0, 0, 0, 0
    for doc, resps in per_sample(hf, "colt_stories_mc").items():
        for (ll_hf, greedy_hf), (ll, greedy) in zip(resps, per_sample(served, "colt_stories_mc")[doc]):
            n_ll += 1
            worst = max(worst, abs(ll - ll_hf))
            if abs(ll - ll_hf) > TOL or greedy != greedy_hf:
                failures += 1
                print(f"  doc {doc}: log-likelihood {ll} (greedy {greedy}) vs hf {ll_hf} (greedy {greedy_hf})")
    for doc, resps in per_sample(hf, "colt_stories_gen").items():
        n_gen += 1
        got = per_sample(served, "colt_stories_gen")[doc]
        same_gen += got == resps
        if got != resps:
            failures += 1
            print(f"  doc {doc}: generated {got!r} vs hf {resps!r}")
    print(f"{n_ll} choices' log-likelihoods: worst |colt serve - hf| {worst:.2g} (limit {TOL}); "
          f"{same_gen}/{n_gen} generations identical; lm-eval took {t_served:.1f} s against colt serve, "
          f"{t_hf:.1f} s with hf")
    print("lm_eval_serve: " + ("FAILED" if failures else "colt serve and hf agree"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
