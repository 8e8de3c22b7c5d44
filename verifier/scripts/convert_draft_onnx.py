"""Convert the draft GGUF into an int4 ONNX model that also outputs hidden states.

Run by `approxy setup` inside its conversion venv; not imported by anything else.
Usage: convert_draft_onnx.py GGUF_PATH OUT_DIR WORK_DIR
       convert_draft_onnx.py --dequantize-only GGUF_PATH HF_DIR
         (step 1 alone: the float32 checkpoint a vLLM target serves)
       convert_draft_onnx.py --variant HF_DIR OUT_DIR WORK_DIR PRECISION [KEY=VALUE ...]
         (steps 2 and 3 from that checkpoint at another precision or with other builder
          options, for `approxy bench draft-fidelity`; e.g. int4 block_size=128)

Steps (recipe from shared/FACTS.md):
1. transformers dequantises the GGUF into a float32 Hugging Face checkpoint (offline).
2. onnxruntime-genai's model builder turns it into int4 ONNX with `hidden_states` exposed.
3. tokenizer.json and the chat template are written next to the model, so the Rust side needs
   nothing from Python at run time.
"""
import json
import os
import shutil
import subprocess
import sys


def dequantize(gguf_path: str, hf_dir: str):
    """Step 1: the GGUF as a float32 Hugging Face checkpoint in hf_dir; returns the tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = os.path.split(os.path.abspath(gguf_path))
    print("loading GGUF", flush=True)
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype="float32")
    # save_pretrained refuses a model that still looks quantised.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    del model
    return tok


def dequantize_only(gguf_path: str, hf_dir: str) -> int:
    tmp = hf_dir + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    dequantize(gguf_path, tmp)
    # Publish atomically, like the ONNX directory.
    shutil.rmtree(hf_dir, ignore_errors=True)
    shutil.move(tmp, hf_dir)
    print("done", flush=True)
    return 0


def build(hf_dir: str, tok, source_name: str, out_dir: str, work_dir: str, precision: str, options):
    """Steps 2 and 3: the checkpoint in hf_dir as ONNX at `precision` with builder `options`
    (KEY=VALUE strings) in out_dir, with the tokenizer, chat template and shape facts."""
    tmp_out = os.path.join(work_dir, "onnx")
    cache_dir = os.path.join(work_dir, "cache")
    for d in (tmp_out, cache_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    print(f"building {precision} ONNX {' '.join(options)}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf_dir, "-o", tmp_out,
         "-p", precision, "-e", "cpu", "-c", cache_dir,
         "--extra_options", "include_hidden_states=true", *options],
        check=True,
    )
    shutil.copy(os.path.join(hf_dir, "tokenizer.json"), os.path.join(tmp_out, "tokenizer.json"))
    template = tok.chat_template
    if not template:
        raise SystemExit("the GGUF carries no chat template")
    with open(os.path.join(tmp_out, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(template)
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    meta = {
        "source_gguf": source_name,
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
        "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "eos_token": tok.eos_token,
        "bos_token": tok.bos_token,
        # How the weights were converted: a verifier is bound to it (DraftMeta::build).
        "precision": precision,
        "extra_options": list(options),
    }
    with open(os.path.join(tmp_out, "approxy_draft.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)

    # Publish atomically: the Rust side treats OUT_DIR as present only when complete.
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.move(tmp_out, out_dir)
    shutil.rmtree(work_dir, ignore_errors=True)
    print("done", flush=True)
    return 0


def variant(hf_dir: str, out_dir: str, work_dir: str, precision: str, *options) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    source = "float32 checkpoint " + os.path.basename(os.path.abspath(hf_dir))
    return build(hf_dir, tok, source, out_dir, work_dir, precision, list(options))


def main() -> int:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if sys.argv[1] == "--dequantize-only":
        return dequantize_only(*sys.argv[2:4])
    if sys.argv[1] == "--variant":
        return variant(*sys.argv[2:])
    gguf_path, out_dir, work_dir = sys.argv[1:4]
    # The shipped draft's precision and builder options (setup's SHIPPED_DRAFT_VARIANT).
    precision = sys.argv[4] if len(sys.argv) > 4 else "int4"
    options = sys.argv[5:]
    hf_dir = os.path.join(work_dir, "hf")
    shutil.rmtree(hf_dir, ignore_errors=True)
    os.makedirs(hf_dir)
    tok = dequantize(gguf_path, hf_dir)
    return build(hf_dir, tok, os.path.basename(gguf_path), out_dir, work_dir, precision, list(options))


if __name__ == "__main__":
    sys.exit(main())
