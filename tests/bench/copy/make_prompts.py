"""Writes prompts.jsonl, the copy-heavy sample of `approxy bench calls --sample copy`: prompts
whose answers copy much of the prompt, where prompt lookup should pay.

- 16 code rewrites: a HumanEval problem's prompt and canonical solution, asked back with one
  small change (type hints, or a new name), the rest kept as it is. HumanEval (MIT) is the copy
  `approxy setup` downloads; pass its path.
- 8 passage answers: a Python standard-library module's docstring (PSF licence) as the passage,
  answered by quoting it.

Usage: python3 make_prompts.py ~/.cache/approxy/data/HumanEval.jsonl.gz > prompts.jsonl
"""
import gzip
import importlib
import json
import sys

problems = [json.loads(l) for l in gzip.open(sys.argv[1], "rt")]
# Spread over the 164 as the HumanEval sample is, from the other end so the two differ.
picked = [problems[len(problems) - 1 - i * len(problems) // 16] for i in range(16)]
asks = [
    "Add Python type hints to this function's parameters and return value. Keep everything else "
    "exactly as it is, the docstring and the body included, and answer with the whole function in "
    "one Python code block.",
    "Rename this function to `solution`. Keep everything else exactly as it is, the docstring and "
    "the body included, and answer with the whole function in one Python code block.",
]
for i, p in enumerate(picked):
    code = p["prompt"] + p["canonical_solution"]
    prompt = f"Here is a Python function:\n\n```python\n{code.strip()}\n```\n\n{asks[i % 2]}"
    print(json.dumps({"id": "copy/" + p["task_id"].replace("/", "-"), "prompt": prompt}))

modules = ["json", "textwrap", "shlex", "heapq", "bisect", "difflib", "fractions", "sched"]
for name in modules:
    doc = " ".join(importlib.import_module(name).__doc__.split())[:1200]
    prompt = (f"Here is a passage:\n\n\"\"\"\n{doc}\n\"\"\"\n\nQuote, word for word, the passage's first "
              "three sentences, each on its own line, then say in one sentence what the passage describes.")
    print(json.dumps({"id": f"copy/passage-{name}", "prompt": prompt}))
