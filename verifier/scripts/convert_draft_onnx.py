"""Convert the draft GGUF into an int4 ONNX model that also outputs hidden states.

Run by `approxy setup` inside its conversion venv; not imported by anything else.
Usage: convert_draft_onnx.py GGUF_PATH OUT_DIR WORK_DIR
       convert_draft_onnx.py --dequantize-only GGUF_PATH HF_DIR
         (step 1 alone: the float32 checkpoint a vLLM target serves)

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


def main() -> int:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if sys.argv[1] == "--dequantize-only":
        return dequantize_only(*sys.argv[2:4])
    gguf_path, out_dir, work_dir = sys.argv[1:4]
    name = os.path.basename(gguf_path)
    hf_dir = os.path.join(work_dir, "hf")
    tmp_out = os.path.join(work_dir, "onnx")
    cache_dir = os.path.join(work_dir, "cache")
    for d in (hf_dir, tmp_out, cache_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)

    tok = dequantize(gguf_path, hf_dir)

    print("building int4 ONNX", flush=True)
    subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf_dir, "-o", tmp_out,
         "-p", "int4", "-e", "cpu", "-c", cache_dir,
         "--extra_options", "include_hidden_states=true"],
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
        "source_gguf": name,
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
        "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "eos_token": tok.eos_token,
        "bos_token": tok.bos_token,
    }
    with open(os.path.join(tmp_out, "approxy_draft.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)

    # Publish atomically: the Rust side treats OUT_DIR as present only when complete.
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.move(tmp_out, out_dir)
    shutil.rmtree(work_dir, ignore_errors=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
