"""Many streams at once: one draft worker drafts for eight openai-client streams
together, each in approximate mode from its first token to its last, none cut."""
import concurrent.futures
import json
import urllib.request

from conftest import MODEL, policy_text

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Explain what a hash map is in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Name three rivers in Europe and one fact about each.",
    "Write a Python function that checks whether a number is prime.",
    "Describe the water cycle briefly.",
    "Write a Python function that flattens a list of lists.",
    "Give two tips for writing clear commit messages.",
]


def stream_one(client, prompt, headers):
    raw = client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=64, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_headers=headers)
    with raw as resp:
        mode = resp.headers["x-approxy-mode"]
        text, finish, usage = "", None, None
        for chunk in resp.parse():
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
    return mode, text, finish, usage


def run_eight(g, headers):
    client = g.client()
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: stream_one(client, p, headers), PROMPTS))
    for prompt, (mode, text, finish, usage) in zip(PROMPTS, results):
        assert mode == "approximate", prompt
        assert finish in ("stop", "length"), (prompt, finish)
        assert usage is not None and usage.completion_tokens > 0, prompt
        u = usage.model_extra["approxy"]
        assert u["mode"] == "approximate", u
        assert u["draft_tokens"] + u["target_tokens"] == usage.completion_tokens, u
        assert len(text) > 10, (prompt, text, usage)


def test_eight_streams_are_drafted_together_and_none_is_cut(start_gateway):
    # The speed floor is the admission's business (its own tests); here every stream must be
    # admitted, so that the eight share one worker's batch.
    g = start_gateway(policy_text(min_stream_speed="0", streams_per_worker="8", workers="1"))
    # Draft only: every stream drafts all the time, so the worker's steps must hold several.
    run_eight(g, {"x-approxy-threshold": "0"})
    metrics = urllib.request.urlopen(g.url + "/metrics", timeout=10).read().decode()
    counts = {}
    for line in metrics.splitlines():
        if line.startswith("approxy_draft_step_streams_"):
            name, value = line.rsplit(" ", 1)
            counts[name] = float(value)
    steps = counts["approxy_draft_step_streams_count"]
    assert counts["approxy_draft_step_streams_sum"] / steps > 1.5, counts
    health = json.loads(urllib.request.urlopen(g.url + "/ready", timeout=10).read())
    assert (health["draft_streams"], health["draft_stream_limit"]) == (0, 8), health
    # With the target: streams leave the batch for its calls and come back, none cut.
    run_eight(g, {})


COPY_SOURCE = '''def mean(xs):
    total = 0
    for x in xs:
        total += x
    return total / len(xs)
'''


def test_streams_with_prompt_lookup_are_drafted_together_and_none_is_cut(start_gateway):
    # Prompt lookup feeds a stream several tokens at once while others share its batch, which
    # the builder's attention refused ("batch_size must be 1 when sequence_length > 1"); the
    # runtime's regrouped graph runs it. Copying prompts make the lookup propose often.
    text = policy_text(min_stream_speed="0", streams_per_worker="4", workers="1")
    text = text.replace('mode = "approximate"', 'mode = "approximate"\nprompt_lookup = 8', 1)
    g = start_gateway(text)
    client = g.client()
    prompts = [f"Repeat this Python function exactly, then stop:\n\n{COPY_SOURCE}" for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: stream_one(client, p, {"x-approxy-threshold": "0"}), prompts))
    used = 0
    for mode, answer, finish, usage in results:
        assert mode == "approximate"
        assert finish in ("stop", "length"), (finish, answer)
        u = usage.model_extra["approxy"]
        assert u["mode"] == "approximate", u
        assert "def mean(xs)" in answer, answer
        used += u["lookup_tokens_used"]
    assert used > 0, "the lookup proposed nothing the draft kept"
