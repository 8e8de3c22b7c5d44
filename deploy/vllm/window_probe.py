"""What one window costs a running vLLM, and how often its token-in endpoint refuses one.

Against a vLLM started as deploy/bootstrap.sh starts it (token-in endpoint, prompt-token details,
32-token cache blocks), with only the Python standard library:
1. a prompt of about PROMPT tokens (from a text file) is computed once (its prefill time);
2. GENERATE tokens are generated on it, read from the cache (the time a generated token takes);
3. WINDOWS windows of K random tokens after that prompt and one new token are scored from the
   prefix cache as approxy scores them (`prompt_logprobs`, `skip_reading_prefix_cache: false`,
   `detokenize: false`): each one's time, its cached count, and whether vLLM answered 400
   because a stale row held a value JSON cannot carry ("Out of range float values").

Usage: python deploy/vllm/window_probe.py URL [TEXT_FILE] (env PROMPT, GENERATE, WINDOWS, K)
"""
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request

URL = sys.argv[1].rstrip("/")
TEXT = sys.argv[2] if len(sys.argv) > 2 else "README.md"
PROMPT = int(os.environ.get("PROMPT", "400"))
GENERATE = int(os.environ.get("GENERATE", "16"))
WINDOWS = int(os.environ.get("WINDOWS", "8"))
K = int(os.environ.get("K", "16"))


def post(path, body):
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=1800) as r:
            return r.status, json.loads(r.read()), time.time() - t
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), time.time() - t


def main():
    model = json.load(urllib.request.urlopen(URL + "/v1/models"))["data"][0]["id"]
    _, tok, _ = post("/tokenize", {"model": model, "prompt": open(TEXT, encoding="utf-8").read()})
    prompt = tok["tokens"][:PROMPT]
    # A marker of this run first, so that nothing of the prompt is in the cache yet.
    prompt = [random.randrange(1000, 30000) for _ in range(4)] + prompt
    status, _, prefill = post("/inference/v1/generate", {"model": model, "token_ids": prompt,
                                                         "sampling_params": {"max_tokens": 1, "temperature": 0, "detokenize": False}})
    print(f"model {model}: prefill of {len(prompt)} prompt tokens {prefill:.2f} s (status {status})")
    status, r, gen = post("/inference/v1/generate", {"model": model, "token_ids": prompt,
                                                     "sampling_params": {"max_tokens": GENERATE, "temperature": 0, "ignore_eos": True, "detokenize": False}})
    per_token = gen / GENERATE
    print(f"{GENERATE} tokens generated on the cached prompt: {gen:.2f} s, {per_token:.3f} s a token "
          f"(cached {r['usage']['prompt_tokens_details']['cached_tokens'] if status == 200 else '?'})")
    refused, times = 0, []
    for i in range(WINDOWS):
        window = [random.randrange(1000, 30000) for _ in range(K + 1)]
        sp = {"max_tokens": 1, "temperature": 0, "prompt_logprobs": 5, "skip_reading_prefix_cache": False, "detokenize": False}
        status, r, dt = post("/inference/v1/generate", {"model": model, "token_ids": prompt + window, "sampling_params": sp})
        if status == 200:
            times.append(dt)
            cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            print(f"window {i}: {dt:.2f} s, {len(prompt) + len(window) - cached} of {len(prompt) + len(window)} prompt tokens computed")
        else:
            refused += 1
            print(f"window {i}: {dt:.2f} s, refused: {status} {str(r)[:160]}")
    if times:
        mean = sum(times) / len(times)
        print(f"a window of {K} from the cache: {mean:.2f} s, {mean / per_token:.2f} generated tokens' time, "
              f"{mean / per_token / K:.3f} of a generated token per drafted token; refused {refused} of {WINDOWS}")
    else:
        print(f"every window refused ({refused} of {WINDOWS})")


if __name__ == "__main__":
    main()
