"""Where one decode step of the draft goes, by ONNX operator: the shipped draft (int4 ONNX) in
ONNX Runtime's own profiler, one thread, the keys and values bound in place as approxy binds
them (one buffer per layer, past and present alike), at batch widths and contexts, for the graph
the runtime loads (`model-grouped.onnx`) and the builder's (`model.onnx`) beside it.

It explains what batching gains (`approxy bench streams`): the weights' matrix products
(MatMulNBits) are read once a step whatever the width, while attention reads every row's cache.
The builder's GroupQueryAttention reads it once per query head; the regrouped graph
(`verifier/scripts/regroup_attention.py`) once per key-value head, seven times less.

Usage: python tests/bench/scripts/draft-step-ops.py MODEL_DIR [--graphs model-grouped.onnx,model.onnx]
       [--widths 1,4,8] [--contexts 128,512,1024] [--steps 10] [--json OUT.json] > OUT.md
(tests/bench/scripts/draft-step-ops.sh makes the venv and runs it on the set-up draft.)
"""

import argparse
import collections
import datetime
import json
import os
import platform
import tempfile
import time

import numpy as np
import onnxruntime as ort

KV_HEADS, HEAD_DIM = 2, 64
WARM = 3


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def part(event):
    """Which part of a step a profiled node is: the weights' products, attention, or other."""
    op, name = event["args"]["op_name"], event["name"]
    if op == "MatMulNBits":
        return "matrix products"
    if op == "GroupQueryAttention" or name.startswith("/regrouped/"):
        return "attention"
    return "other"


def session(model_dir, graph, profile):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "draft")
    return ort.InferenceSession(os.path.join(model_dir, graph), so, providers=["CPUExecutionProvider"])


def bound(s, width, context):
    """`s`'s binding for `width` rows of `context` cached positions, as approxy binds them; the
    buffers it points into are returned with it, to be held while it is used."""
    # The row room approxy's batch gives (a sixteenth to spare, at least 64, steps of 64).
    total = context + 1
    capacity = -(-(total + max(total // 16, 64)) // 64) * 64
    io = s.io_binding()
    buffers = []
    for inp in s.get_inputs():
        if inp.name.startswith("past_key_values"):
            # Written, as a real cache is: a fresh np.zeros is the kernel's one shared zero page
            # until touched, which every read then finds in the CPU's cache (read that way, the
            # table of 2026-11-29 06:24 UTC gave eight rows at 1,024 tokens 2.66x one row; written,
            # 08:53 UTC, 2.48x).
            buf = ort.OrtValue.ortvalue_from_numpy(np.full((width, KV_HEADS, capacity, HEAD_DIM), 0.01, np.float32))
            buffers.append(buf)
            io.bind_ortvalue_input(inp.name, buf)
            io.bind_ortvalue_output(inp.name.replace("past_key_values", "present"), buf)
    io.bind_cpu_input("input_ids", np.full((width, 1), 100, np.int64))
    io.bind_cpu_input("attention_mask", np.ones((width, total), np.int64))
    io.bind_output("logits")
    io.bind_output("hidden_states")
    return io, buffers


def measure(model_dir, graph, plain, width, context, steps):
    """Mean ms a step without the profiler, on `plain` (a session of `graph` without it: it adds
    its own cost to every node, and the regrouped graph has more of them), and ms a step by part
    with it, for `width` rows of `context` cached positions. A profile covers a session's whole
    life, so each measurement profiles a session of its own."""
    io, held = bound(plain, width, context)
    for _ in range(WARM):
        plain.run_with_iobinding(io)
    t = time.perf_counter()
    for _ in range(steps):
        plain.run_with_iobinding(io)
    step_ms = (time.perf_counter() - t) / steps * 1e3
    s = session(model_dir, graph, True)
    io, held = bound(s, width, context)
    for _ in range(WARM + steps):
        s.run_with_iobinding(io)
    path = s.end_profiling()
    by_part = collections.defaultdict(float)
    for e in json.load(open(path)):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_part[part(e)] += e["dur"] / 1e3 / (WARM + steps)
    os.remove(path)
    return step_ms, dict(by_part)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--graphs", default="model-grouped.onnx,model.onnx")
    ap.add_argument("--widths", default="1,4,8")
    ap.add_argument("--contexts", default="128,512,1024")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
    contexts = [int(c) for c in a.contexts.split(",")]
    rows = []
    for graph in a.graphs.split(","):
        plain = session(a.model_dir, graph, False)
        for context in contexts:
            for width in widths:
                step_ms, by_part = measure(a.model_dir, graph, plain, width, context, a.steps)
                rows.append({"graph": graph, "context": context, "width": width, "step_ms": step_ms,
                             "ms_by_part": by_part})
    cores = len(os.sched_getaffinity(0))
    machine = f"{cores} core{'s' if cores > 1 else ''} of {cpu_name()}"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = {"date": date, "machine": machine, "onnxruntime": ort.__version__, "steps": a.steps, "rows": rows}
    if a.json:
        json.dump(report, open(a.json, "w"), indent=1)
    print(f"One decode step of the draft (int4 ONNX, ONNX Runtime {ort.__version__}, one thread), "
          f"{a.steps} steps after {WARM} warm-up, by ONNX Runtime's profiler; {machine}, {date}. "
          f"Command: `tests/bench/scripts/draft-step-ops.sh`. Graphs: `model-grouped.onnx` is what approxy runs "
          f"(attention regrouped), `model.onnx` the builder's (GroupQueryAttention). Step times are "
          f"taken without the profiler, the parts with it (it adds to every node's time).\n")
    print("| graph | context | rows | step ms | all rows against one row alone | profiled: matrix products (MatMulNBits) ms | profiled: attention ms | profiled: other ms |")
    print("|---|---|---|---|---|---|---|---|")
    alone = {}
    for r in rows:
        key = (r["graph"], r["context"])
        one = alone.setdefault(key, r["step_ms"] if r["width"] == 1 else None)
        ratio = f"{r['width'] * one / r['step_ms']:.2f}x" if one else "-"
        ms = r["ms_by_part"]
        print(f"| {r['graph']} | {r['context']} | {r['width']} | {r['step_ms']:.1f} | {ratio} | "
              f"{ms.get('matrix products', 0):.1f} | {ms.get('attention', 0):.1f} | {ms.get('other', 0):.1f} |")


if __name__ == "__main__":
    main()
