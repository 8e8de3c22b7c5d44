"""approxy in front of a target whose tokenizer is not the draft's: SmolLM2-135M in llama-server
(APPROXY_TEST_OTHER_TARGET_URL, started by deploy/test-all.sh) behind the Qwen draft. Text-level
kinds send text and re-tokenize what comes back, so approximate mode works; at threshold 1
(every draft token rejected) the answer is the target's own."""
import os
import re

import pytest

from conftest import REPO, approxy_usage, assert_same_up_to_a_tie, with_kind

OTHER = os.environ.get("APPROXY_TEST_OTHER_TARGET_URL")
OTHER_MODEL = os.environ.get("APPROXY_TEST_OTHER_TARGET_MODEL", "smollm2-135m-instruct")

pytestmark = pytest.mark.skipif(not OTHER, reason="APPROXY_TEST_OTHER_TARGET_URL is not set (deploy/test-all.sh sets it)")

# An explicit system message: both chat templates are ChatML, and then render the same text
# (without one, each injects its own default system prompt).
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a Python function that returns the largest of three numbers."}]


def policy(kind, style=None):
    text = (REPO / "policies" / "default.toml").read_text()
    text = with_kind(text, kind, f'prefix_style = "{style}"' if style else "")
    text = re.sub(r'^base_url = .*$', f'base_url = "{OTHER}/v1"', text, flags=re.M)
    text = re.sub(r'^threshold_override = .*$', "threshold_override = [0.0, 1.0]", text, flags=re.M)
    # A self-hosted target: no prices, so no cost guard, and every rejection is a span call.
    return re.sub(r'^price = .*$', "price = { input = 0.0, cached_input = 0.0, output = 0.0 }", text, flags=re.M)


@pytest.mark.parametrize("kind,style", [("openai_text", None), ("chat_prefix", "prefill")])
def test_threshold_one_gives_the_targets_own_answer(start_gateway, kind, style):
    g = start_gateway(policy(kind, style))
    c = g.client()
    ready = __import__("httpx").get(g.url + "/ready").json()
    assert ready["target_reachable"] is True
    kw = dict(model=OTHER_MODEL, messages=MESSAGES, max_tokens=80, temperature=0)
    raw = c.chat.completions.with_raw_response.create(extra_headers={"x-approxy-threshold": "1"}, **kw)
    assert raw.headers["x-approxy-mode"] == "approximate"
    u = approxy_usage(raw)
    # Several spans, so answers crossed healed boundaries; every token is the target's.
    assert u["draft_tokens"] == 0 and u["target_calls"] >= 2, u
    ours = raw.parse().choices[0].message.content
    # logprobs makes approxy pass the request through: the target's own greedy answer.
    direct = c.chat.completions.create(logprobs=True, top_logprobs=2, **kw).choices[0]
    theirs = direct.message.content
    if direct.finish_reason == "stop" and raw.parse().choices[0].finish_reason == "stop":
        # Both ended: the same answer, or two that parted at a tie (checked below).
        assert ours == theirs or not (ours.startswith(theirs) or theirs.startswith(ours)), (ours, theirs, u)
    else:
        # max_tokens counts draft tokens in approxy and the target's own tokens when passed
        # through, so a cut answer ends at a different place: the shorter is the longer's start.
        assert len(ours) > 40, (ours, u)
    assert_same_up_to_a_tie(ours, direct, kind)
    # And in between, approximate mode runs: the draft writes some of it.
    mixed = approxy_usage(c.chat.completions.with_raw_response.create(extra_headers={"x-approxy-threshold": "0.7"}, **kw))
    assert mixed["draft_tokens"] + mixed["target_tokens"] > 0, mixed
    print(f"{kind}: threshold 1: {u['target_calls']} calls ({u['heal_retries']} unhealed retries); "
          f"0.7: {mixed['draft_tokens']} draft / {mixed['target_tokens']} target tokens, {mixed['target_calls']} calls")
