"""summarize.py - the learning race's table and plots (bench/gpu/learning_race.sh writes the inputs).

Usage: python3 summarize.py RESULTS_DIR [--threshold R] [--last 10]
Reads RESULTS_DIR/logs/<system>_s<seed>.metrics.jsonl (colt's metrics.jsonl, or trl_grpo.py's), eval/base.json,
eval/<system>_s<seed>.json (colt eval summaries) and eval/hf_*.json (score_hf.py), and writes
  race.csv        one row per system, seed and step: seconds since training started, step_time, rewards, length
  race.md         the table (below), the judgment rule evaluated, the transformers check
  race_reward_step.png, race_reward_time.png, race_accuracy.png
Seconds since training started = the running sum of each step's step_time, on both sides (colt's metrics.jsonl
step_time; TRL's measured by trl_grpo.py's callback from on_step_begin to on_step_end): model loading, set-up,
the server's start and the logging between steps are left out alike.
Table, per system: seeds; final reward = mean reward of the last --last steps of a run, mean ± standard error
over seeds; the same for the correctness reward alone; held-out pass@1 before (the base model) and after
(mean ± s.e. over seeds); s/step (mean over steps 2.. of each run, then over seeds); training seconds; seconds
and steps to the threshold (the first step at which the reward's 5-step running mean reaches it; '-' if never).
Judgment: colt's systems against TRL's: final reward and held-out accuracy each within 2 standard errors of the
difference (sqrt(se_colt^2 + se_trl^2)) counts as "the same learning"; the speed-up is TRL's s/step and time to
threshold over colt's. Runs on the CPU (matplotlib's Agg backend).
"""
import argparse
import csv
import glob
import json
import math
import os
import re

ORDER = ["colt", "colt_server", "colt_async", "trl", "trl_cb"]
LABEL = {"colt": "colt colocated", "colt_server": "colt server mode (1 GPU, 2 processes)",
         "colt_async": "colt async (1 GPU, 2 processes)", "trl": "TRL 1.16", "trl_cb": "TRL 1.16, continuous batching"}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def se(xs):
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def fmt(m, s=float("nan"), d=3):
    if m != m:
        return "-"
    return f"{m:.{d}f}" if s != s else f"{m:.{d}f} ± {s:.{d}f}"


def load_runs(root):
    runs = {}  # system -> seed -> list of step rows
    for path in sorted(glob.glob(os.path.join(root, "logs", "*.metrics.jsonl"))):
        m = re.match(r"(.+)_s(\d+)\.metrics\.jsonl$", os.path.basename(path))
        if not m:
            continue
        rows, t = [], 0.0
        for line in open(path):
            if not line.strip():
                continue
            r = json.loads(line)
            if "step_time" not in r or r.get("reward") is None:  # eval lines, steps without a round
                continue
            t += r["step_time"]
            rows.append({"step": r["step"], "seconds": t, "step_time": r["step_time"], "reward": r["reward"],
                         "correct": r.get("rewards/correct/mean"), "format": r.get("rewards/answer_format/mean"),
                         "mean_length": r.get("completions/mean_length")})
        if rows:
            runs.setdefault(m.group(1), {})[int(m.group(2))] = rows
    return runs


def load_eval(root, name):
    p = os.path.join(root, "eval", name + ".json")
    return json.load(open(p))["pass@1"] if os.path.exists(p) else None


def first_reach(rows, thr, window=5):
    for i in range(len(rows)):
        w = rows[max(0, i - window + 1):i + 1]
        if mean([r["reward"] for r in w]) >= thr:
            return rows[i]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--threshold", type=float)
    ap.add_argument("--last", type=int, default=10)
    a = ap.parse_args()
    runs = load_runs(a.root)
    if not runs:
        raise SystemExit(f"summarize: no logs/*.metrics.jsonl with rewards in {a.root}")
    systems = [s for s in ORDER if s in runs] + sorted(s for s in runs if s not in ORDER)

    with open(os.path.join(a.root, "race.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "seed", "step", "seconds", "step_time", "reward", "correct", "format", "mean_length"])
        for s in systems:
            for seed, rows in sorted(runs[s].items()):
                for r in rows:
                    w.writerow([s, seed, r["step"], f"{r['seconds']:.4f}", f"{r['step_time']:.4f}", r["reward"],
                                r["correct"], r["format"], r["mean_length"]])

    stats = {}
    for s in systems:
        seeds = sorted(runs[s])
        final = [mean([r["reward"] for r in runs[s][k][-a.last:]]) for k in seeds]
        final_c = [mean([r["correct"] for r in runs[s][k][-a.last:] if r["correct"] is not None]) for k in seeds]
        first = [mean([r["reward"] for r in runs[s][k][:5]]) for k in seeds]
        sps = [mean([r["step_time"] for r in runs[s][k][1:]] or [runs[s][k][0]["step_time"]]) for k in seeds]
        total = [runs[s][k][-1]["seconds"] for k in seeds]
        acc = [x for x in (load_eval(a.root, f"{s}_s{k}") for k in seeds) if x is not None]
        stats[s] = dict(seeds=seeds, final=final, final_c=final_c, first=first, sps=sps, total=total, acc=acc,
                        steps=[len(runs[s][k]) for k in seeds])
    thr = a.threshold
    if thr is None:  # halfway from the start to the lowest system's final reward: a level every system reaches
        start = mean([x for s in systems for x in stats[s]["first"]])
        low = min(mean(stats[s]["final"]) for s in systems)
        thr = round(start + 0.5 * (low - start), 3)
    for s in systems:
        hits = [first_reach(runs[s][k], thr) for k in stats[s]["seeds"]]
        stats[s]["reach_s"] = [h["seconds"] for h in hits if h]
        stats[s]["reach_step"] = [h["step"] for h in hits if h]
        stats[s]["reached"] = sum(1 for h in hits if h)

    base = load_eval(a.root, "base")
    L = []
    L.append("| system | seeds | steps | final reward (last %d) | final correct reward | held-out pass@1 before | "
             "after | s/step | training s | s to reward %.3f | steps to it |" % (a.last, thr))
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in systems:
        x = stats[s]
        reach = f"{fmt(mean(x['reach_s']), se(x['reach_s']), 1)} ({x['reached']}/{len(x['seeds'])})"
        L.append(f"| {LABEL.get(s, s)} | {len(x['seeds'])} | {round(mean(x['steps']))} | "
                 f"{fmt(mean(x['final']), se(x['final']))} | {fmt(mean(x['final_c']), se(x['final_c']))} | "
                 f"{fmt(base if base is not None else float('nan'), d=2)} | {fmt(mean(x['acc']), se(x['acc']), 2)} | "
                 f"{fmt(mean(x['sps']), se(x['sps']))} | {fmt(mean(x['total']), se(x['total']), 1)} | {reach} | "
                 f"{fmt(mean(x['reach_step']), se(x['reach_step']), 1)} |")
    L.append("")
    L.append("± is the standard error over seeds (- with one seed). Seconds are the running sum of step_time "
             "(loading and set-up left out on both sides).")
    L.append("")
    if "trl" in stats:
        t = stats["trl"]
        L.append("Judgment (same learning: colt's final reward and held-out pass@1 each within 2 standard errors "
                 "of TRL's; speed: TRL's s/step and seconds to the threshold over colt's):")
        L.append("")
        for s in systems:
            if not s.startswith("colt"):
                continue
            c, verdicts = stats[s], []
            for key, what in (("final", "final reward"), ("acc", "held-out pass@1")):
                if len(c[key]) < 2 or len(t[key]) < 2:
                    verdicts.append(f"{what}: not enough seeds for a standard error")
                    continue
                d = mean(c[key]) - mean(t[key])
                bound = 2 * math.sqrt(se(c[key]) ** 2 + se(t[key]) ** 2)
                verdicts.append(f"{what} {mean(c[key]):.3f} vs {mean(t[key]):.3f}, difference {d:+.3f}, "
                                f"2 s.e. {bound:.3f}: {'same' if abs(d) <= bound else 'DIFFERENT'}")
            speed = mean(t["sps"]) / mean(c["sps"])
            line = f"- {LABEL.get(s, s)}: " + "; ".join(verdicts) + f"; {speed:.1f}x TRL's steps per second"
            if c["reach_s"] and t["reach_s"]:
                line += f", reward {thr:.3f} {mean(t['reach_s']) / mean(c['reach_s']):.1f}x sooner in seconds"
            L.append(line)
        L.append("")
    for p in sorted(glob.glob(os.path.join(a.root, "eval", "hf_*.json"))):
        h = json.load(open(p))
        line = f"transformers on {os.path.basename(p)[3:-5]}'s checkpoint ({h['dtype']}, {h['device']}): pass@1 {h['pass@1']:.3f}"
        if "colt_eval_pass1" in h:
            line += (f"; colt eval {h['colt_eval_pass1']:.3f}; same verdict on {h['same_verdict']} of {h['problems']}"
                     f", identical completion on {h.get('same_completion')} of {h['problems']}")
        L.append(line)
    md = "\n".join(L) + "\n"
    with open(os.path.join(a.root, "race.md"), "w") as f:
        f.write(md)
    print(md, end="")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = dict(zip(ORDER, ["C0", "C2", "C4", "C3", "C1"]))
    for xkey, fname, xlabel in (("step", "race_reward_step.png", "optimizer step"),
                                ("seconds", "race_reward_time.png", "seconds since training started")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for s in systems:
            for i, (seed, rows) in enumerate(sorted(runs[s].items())):
                ax.plot([r[xkey] for r in rows], [r["reward"] for r in rows], color=colors.get(s), alpha=0.25, lw=0.8)
            n = min(len(r) for r in runs[s].values())
            xs = [mean([runs[s][k][i][xkey] for k in runs[s]]) for i in range(n)]
            ys = [mean([runs[s][k][i]["reward"] for k in runs[s]]) for i in range(n)]
            ax.plot(xs, ys, color=colors.get(s), lw=2, label=f"{LABEL.get(s, s)} (mean of {len(runs[s])})")
        ax.axhline(thr, color="grey", ls=":", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean reward (correct + format)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(a.root, fname), dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = (["base model"] if base is not None else []) + [LABEL.get(s, s) for s in systems]
    vals = ([base] if base is not None else []) + [mean(stats[s]["acc"]) for s in systems]
    errs = ([0] if base is not None else []) + [0 if se(stats[s]["acc"]) != se(stats[s]["acc"]) else se(stats[s]["acc"]) for s in systems]
    ax.barh(range(len(names)), [0 if v != v else v for v in vals], xerr=errs, color="C0")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("held-out pass@1 (greedy, colt eval)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(os.path.join(a.root, "race_accuracy.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
