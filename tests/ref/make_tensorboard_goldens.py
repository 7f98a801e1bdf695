"""TensorBoard event-file goldens for tests/test_tensorboard.c, made with the `tensorboard` package (pip
install tensorboard; tested with 2.21.0), no network.

    python3 tests/ref/make_tensorboard_goldens.py           # writes tests/data/tensorboard/golden.tfevents + .json
    python3 tests/ref/make_tensorboard_goldens.py --check OUTPUT_DIR [--expect-eval N]

The golden file is written by TensorBoard's own code: Event protos from tensorboard.compat.proto and
TensorBoard's RecordWriter (length, masked CRC32C, data, masked CRC32C). test_tensorboard writes the same events
with colt's writer and requires the same bytes. golden.json is what TensorBoard's reader (LegacyEventFileLoader,
which checks both CRCs, without converting scalars to tensors) reads back from the golden file: the test's own reader must read the same.

--check reads a colt run's event files (OUTPUT_DIR/runs/*/events.out.tfevents.* or $TENSORBOARD_LOGGING_DIR)
with TensorBoard's EventAccumulator and compares every scalar with OUTPUT_DIR/metrics.jsonl: each number of
each line must be there as train/<key> (eval_<x> as eval/<x>) at the line's step, equal up to metrics.jsonl's 8
significant digits and the event's 32-bit float.
Exit 1 on any difference.
"""

import argparse
import glob
import json
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "..", "data", "tensorboard")
WALL_TIME = 1700000000.25

# (tag, value, step): what test_tensorboard.c writes in this order.
SCALARS = [
    ("train/reward", 0.5, 1),
    ("train/loss", -0.0123, 1),
    ("train/kl", 1e-5, 1),
    ("train/rewards/park/mean", 0.875, 1),
    ("eval/reward", 0.25, 1),
    ("train/reward", 0.75, 2),
    ("train/learning_rate", 3e-6, 2),
    ("train/num_tokens", 123456789.0, 2),
    ("train/big_step", -1e30, 1000000000000),
    ("train/zero", 0.0, 0),
]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def make_goldens():
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, "golden.tfevents")
    with open(path, "wb") as fp:
        writer = RecordWriter(fp)
        writer.write(event_pb2.Event(wall_time=WALL_TIME, file_version="brain.Event:2").SerializeToString())
        for tag, value, step in SCALARS:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            writer.write(event_pb2.Event(wall_time=WALL_TIME, step=step, summary=summary).SerializeToString())
        writer.flush()
    events = []
    # the loader checks both CRCs of every record and stops at the first bad one: all must come back
    for ev in LegacyEventFileLoader(path).Load():
        if ev.HasField("file_version"):
            events.append({"wall_time": ev.wall_time, "step": ev.step, "file_version": ev.file_version})
        else:
            for v in ev.summary.value:
                events.append({"wall_time": ev.wall_time, "step": ev.step, "tag": v.tag, "value": v.simple_value})
    assert len(events) == len(SCALARS) + 1
    for (tag, value, step), ev in zip(SCALARS, events[1:]):
        assert ev["tag"] == tag and ev["step"] == step and ev["value"] == f32(value), (ev, tag, value, step)
    with open(os.path.join(OUT_DIR, "golden.json"), "w") as fp:
        json.dump({"made_by": "tests/ref/make_tensorboard_goldens.py", "events": events}, fp, indent=1)
        fp.write("\n")
    print(f"{path}: {os.path.getsize(path)} bytes, {len(events)} events read back by TensorBoard's LegacyEventFileLoader")


def check_run(output_dir, expect_eval):
    log_root = os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(output_dir, "runs")
    files = sorted(glob.glob(os.path.join(log_root, "**", "events.out.tfevents.*"), recursive=True))
    if not files:
        sys.exit(f"no event files under {log_root}")
    scalars = {}
    for d in sorted({os.path.dirname(f) for f in files}):
        acc = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for s in acc.Scalars(tag):
                scalars[(tag, s.step)] = s.value
    compared, bad = 0, []
    with open(os.path.join(output_dir, "metrics.jsonl")) as fp:
        for line in fp:
            row = json.loads(line)
            for key, value in row.items():
                if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                tag = "eval/" + key[5:] if key.startswith("eval_") else "train/" + key
                got = scalars.get((tag, row["step"]))
                compared += 1
                # metrics.jsonl prints 8 significant digits (relative 5e-8), the event holds a float32 (6e-8)
                if got is None or not abs(got - value) <= 1.2e-7 * abs(value):
                    bad.append((tag, row["step"], value, got))
    evals = sorted(step for (tag, step) in scalars if tag == "eval/reward")
    print(f"{len(files)} event file(s), {len(scalars)} scalars read by TensorBoard's EventAccumulator; "
          f"{compared} metrics.jsonl values compared, {len(bad)} differ; eval/reward at steps {evals}")
    for b in bad[:10]:
        print("  differs:", b)
    if bad or (expect_eval is not None and len(evals) != expect_eval):
        sys.exit(1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", metavar="OUTPUT_DIR")
    ap.add_argument("--expect-eval", type=int, default=None, help="eval/reward points the run must have")
    args = ap.parse_args()
    if args.check:
        check_run(args.check, args.expect_eval)
    else:
        make_goldens()
