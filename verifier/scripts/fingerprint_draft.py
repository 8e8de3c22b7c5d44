"""A numeric fingerprint of a converted draft: what `approxy setup` compares with the committed
reference instead of the weights' bytes.

Run by `approxy setup` inside its conversion venv, right after a conversion; not imported by
anything else. Usage:
    fingerprint_draft.py MODEL_DIR OUT_JSON [REFERENCE_JSON]

Why not a checksum: the int4 conversion's bytes depend on the CPU family it ran on (an Intel
Xeon and an AMD EPYC give different `model.onnx.data` from the same packages), because some step
rounds differently at exact ties. A checksum then refuses a conversion that is the same model.
The fingerprint records what such rounding can and cannot change:
- weights: for every initializer its shape, block layout and whole-tensor statistics (for int4
  weights the count of each of the 16 levels and the sum of the block scales; for float tensors
  the sum and sum of squares), and the exact values at a fixed sample of elements (the int4 level
  and its block's scale, or the float value);
- logits: one forward pass over fixed token sequences, recording at every position the top
  tokens and their logits, and, given a reference, the logits at the reference's top tokens.
The comparison and its tolerances live in Rust (deploy/setup/src/fingerprint.rs).
"""
import json
import sys
import zlib

import numpy as np

# Elements sampled per tensor: int4 levels (a garbled 3 % of a tensor shows in 256 samples but
# for a chance of 0.04 %), and scales and float values (which rounding does not move at all).
LEVEL_SAMPLES = 256
VALUE_SAMPLES = 64
# Top tokens recorded per position.
TOP_K = 8
# Fixed text, tokenised with the draft's own tokenizer: code and prose, as traffic is.
TEXTS = [
    "def moving_average(values, window):\n    \"\"\"Return the moving averages of values over a window.\"\"\"\n"
    "    out = []\n    total = 0.0\n    for i, v in enumerate(values):\n        total += v\n",
    "The quickest way to learn a new language is to read a little every day, speak with people "
    "who use it, and not to fear making mistakes. Start with short stories and",
    "<|im_start|>user\nGive me three tips for writing clear emails.<|im_end|>\n<|im_start|>assistant\n"
    "1. **Start with the point.**",
]


def sample_positions(n: int, salt: str, count: int) -> np.ndarray:
    """`count` fixed element indices in [0, n), the same on every machine."""
    seed = (zlib.crc32(salt.encode("utf-8")) << 32) | (n & 0xFFFFFFFF)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(count, n), replace=False))


def weights(model_dir: str) -> dict:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(f"{model_dir}/model.onnx", load_external_data=True)
    nbits = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            nbits[node.input[1]] = (node.input[2], attrs)
    out = {}
    scale_names = {scales for scales, _ in nbits.values()}
    for init in model.graph.initializer:
        name = init.name
        if name in scale_names:
            continue
        arr = numpy_helper.to_array(init)
        entry = {"dtype": onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name,
                 "shape": list(arr.shape)}
        if name in nbits:
            scales_name, attrs = nbits[name]
            scales = numpy_helper.to_array(
                next(i for i in model.graph.initializer if i.name == scales_name)
            ).astype(np.float32)
            bits, block = int(attrs["bits"]), int(attrs["block_size"])
            k, n = int(attrs["K"]), int(attrs["N"])
            entry.update({"bits": bits, "block_size": block, "k": k, "n": n})
            if bits != 4:
                # Another precision: record its layout; the comparison refuses it.
                out[name] = entry
                continue
            lo, hi = arr & 0xF, arr >> 4
            levels = np.stack([lo, hi], -1).reshape(n, -1)[:, :k]  # [N, K], level 0..15
            entry["level_counts"] = np.bincount(levels.reshape(-1), minlength=16).tolist()
            entry["scale_sum"] = float(scales.astype(np.float64).sum())
            entry["scale_abs_sum"] = float(np.abs(scales.astype(np.float64)).sum())
            idx = sample_positions(n * k, name, LEVEL_SAMPLES)
            rows, cols = idx // k, idx % k
            entry["sample_levels"] = "".join("%x" % v for v in levels[rows, cols])
            idx = sample_positions(n * k, name + "/scales", VALUE_SAMPLES)
            rows, cols = idx // k, idx % k
            entry["sample_scale"] = scales.reshape(n, -1)[rows, cols // block].tolist()
        elif arr.dtype.kind == "f":
            flat = arr.reshape(-1).astype(np.float32)
            entry["sum"] = float(flat.astype(np.float64).sum())
            entry["sum_sq"] = float(np.square(flat.astype(np.float64)).sum())
            idx = sample_positions(flat.size, name, VALUE_SAMPLES)
            entry["sample_value"] = flat[idx].tolist()
        out[name] = entry
    return out


def logits(model_dir: str, reference) -> list:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    meta = json.load(open(f"{model_dir}/approxy_draft.json", encoding="utf-8"))
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(f"{model_dir}/model.onnx", opts, providers=["CPUExecutionProvider"])
    layers, heads, dim = meta["num_hidden_layers"], meta["num_key_value_heads"], meta["head_dim"]
    sequences = []
    for t, text in enumerate(TEXTS):
        ids = tok.encode(text).ids
        feed = {"input_ids": np.array([ids], dtype=np.int64),
                "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
        for i in range(layers):
            for kv in ("key", "value"):
                feed[f"past_key_values.{i}.{kv}"] = np.zeros((1, heads, 0, dim), dtype=np.float32)
        out = sess.run(["logits"], feed)[0][0].astype(np.float32)  # [s, vocab]
        positions = []
        for p in range(len(ids)):
            row = out[p]
            top = np.argsort(-row, kind="stable")[:TOP_K]
            pos = {"top_ids": top.tolist(), "top_logits": row[top].tolist()}
            if reference is not None:
                ref_ids = reference["logits"][t]["positions"][p]["top_ids"]
                pos["at_reference_ids"] = row[ref_ids].tolist()
            positions.append(pos)
        sequences.append({"ids": ids, "positions": positions})
    return sequences


def main() -> int:
    model_dir, out_path = sys.argv[1], sys.argv[2]
    reference = json.load(open(sys.argv[3], encoding="utf-8")) if len(sys.argv) > 3 else None
    meta = json.load(open(f"{model_dir}/approxy_draft.json", encoding="utf-8"))
    fp = {
        "format": 1,
        "build": " ".join([meta.get("precision") or "int4", *meta.get("extra_options", [])]),
        "weights": weights(model_dir),
        "logits": logits(model_dir, reference),
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(fp, f, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
