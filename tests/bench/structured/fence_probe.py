"""Whether llama-server's own answer to a `response_format` depends on the Markdown fence its
grammar lets the model open with (tests/README.md, "Structured output", the fence).

For each schema and JSON-mode prompt of the sample, llama-server's `/completion` is asked,
greedy, under the prompt's schema (`json_schema`, applied from the first generated token), once
after the chat prompt alone and once after the chat prompt and the fence's opening. Each answer's
leaf fields are compared with target-only's answer in a saved structured run (its
`target_only`, which is llama-server's `/v1/chat/completions` with the `response_format`).

Usage (a llama-server with the target model on URL; the saved run, as the benchmark writes it):
    python3 tests/bench/structured/fence_probe.py http://127.0.0.1:8081 \
        deploy/results/structured/target-only-2026-11-28T0611.json
"""

import json
import pathlib
import sys
import urllib.request

HERE = pathlib.Path(__file__).parent
FENCE_OPEN = "```json\n"


def post(url, path, body):
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def leaves(v, at=""):
    """Every leaf of a JSON value, by its path."""
    if isinstance(v, dict):
        return {k: x for key, val in v.items() for k, x in leaves(val, f"{at}/{key}").items()}
    if isinstance(v, list):
        return {k: x for i, val in enumerate(v) for k, x in leaves(val, f"{at}/{i}").items()}
    return {at: v}


def agreement(answer, reference):
    """The share of the reference's leaves the answer has with the same value."""
    ref = leaves(reference)
    got = leaves(answer)
    return sum(got.get(k, object()) == v for k, v in ref.items()) / max(1, len(ref))


def main():
    url, saved = sys.argv[1], json.loads(pathlib.Path(sys.argv[2]).read_text())
    reference = {r["id"]: r["target_only"]["content"] for r in saved["rows"]}
    prompts = [json.loads(line) for line in (HERE / "prompts.jsonl").open()]
    totals = {}
    for p in prompts:
        rf = p.get("response_format")
        if not rf or p["id"] not in reference:
            continue
        schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else {"type": "object"}
        prompt = post(url, "/apply-template", {"messages": p["messages"]})["prompt"]
        ref = json.loads(reference[p["id"]])
        row = {}
        for name, opening in (("bare", ""), ("fenced", FENCE_OPEN)):
            v = post(url, "/completion", {"prompt": prompt + opening, "json_schema": schema,
                                          "temperature": 0, "n_predict": 400, "cache_prompt": True})
            row[name] = agreement(json.loads(v["content"]), ref)
        for name, a in row.items():
            totals.setdefault((p["kind"], name), []).append(a)
        print(p["id"], " ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    print("\nkind: fields agreeing with target-only, bare / fenced")
    for kind in dict.fromkeys(k for k, _ in totals):
        bare, fenced = (totals[(kind, n)] for n in ("bare", "fenced"))
        print(f"{kind} ({len(bare)}): {100 * sum(bare) / len(bare):.1f} % / "
              f"{100 * sum(fenced) / len(fenced):.1f} %")
    everything = [(n, [a for (k, m), xs in totals.items() if m == n for a in xs]) for n in ("bare", "fenced")]
    print("all: " + " / ".join(f"{100 * sum(xs) / len(xs):.1f} %" for _, xs in everything))


if __name__ == "__main__":
    main()
