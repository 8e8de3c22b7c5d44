"""Builds training/data/prompts.jsonl: the prompt corpus for verifier training.

Code prompts come from the docstrings and signatures of public functions in CPython's own
standard library (read with `ast`, nothing imported). Chat prompts come from question templates
over a hand-written topic list. Deterministic: the same Python version gives the same file.
HumanEval (the evaluation set) is not used here; a test checks that the corpus shares no
function names or long word runs with it.

Usage: python3 build_corpus.py OUT.jsonl HUMANEVAL.jsonl.gz
(the HumanEval file is `$APPROXY_HOME/data/HumanEval.jsonl.gz`, provided by `approxy setup`;
its function names are excluded so no training prompt asks for a HumanEval function).
"""
import ast
import gzip
import json
import pathlib
import random
import re
import sys
import sysconfig

CODE_TEMPLATES = [
    "Write a Python function `{sig}` that {doc}",
    "Implement `{sig}` in Python. It should {doc}",
    "Write a Rust function equivalent to Python's `{qual}`, which {doc}",
    "Explain what Python's `{qual}` does ({doc_short}) and show a short usage example.",
    "Write a JavaScript function `{name}` that {doc}",
    "Write unit tests with pytest for a function `{sig}` that {doc}",
]

TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "compound interest", "sourdough bread",
    "the water cycle", "jet lag", "the Roman Empire", "vaccines", "plate tectonics", "inflation",
    "meditation", "the stock market", "climate change", "the human immune system", "renewable energy",
    "the Silk Road", "chess openings", "coffee brewing", "marathon training", "sleep hygiene",
    "the Renaissance", "electric cars", "honeybees", "the Moon landing", "volcanoes", "jazz music",
    "learning a second language", "public speaking", "time management", "houseplants", "the printing press",
    "the Great Wall of China", "earthquakes", "the Olympic Games", "tea ceremonies", "composting",
    "budget travel", "job interviews", "negotiating a salary", "writing a cover letter", "first aid",
    "the ancient Egyptians", "coral reefs", "the northern lights", "hurricanes", "recycling",
    "minimalism", "gardening in small spaces", "baking bread", "the Industrial Revolution",
    "democracy", "the scientific method", "DNA", "evolution", "the solar system", "gravity",
    "rainbows", "tides", "the internet's history", "cryptocurrency", "photography basics",
    "watercolor painting", "the piano", "yoga", "nutrition labels", "food allergies", "dog training",
    "adopting a cat", "moving to a new city", "making friends as an adult", "procrastination",
    "stress management", "home insurance", "renting versus buying a home", "retirement savings",
    "the history of the bicycle", "solar panels", "wind turbines", "the Amazon rainforest",
    "Antarctica", "the Mediterranean diet", "fermentation", "the Beatles", "Shakespeare",
    "Greek mythology", "the Cold War", "the Apollo program", "origami", "knitting", "camping",
]

CHAT_TEMPLATES = [
    "Explain {t} to a ten-year-old.",
    "What are the most common misconceptions about {t}?",
    "Give me three interesting facts about {t}.",
    "Write a short paragraph introducing {t}.",
    "What should a beginner know about {t}?",
    "Summarize the history of {t} in a few sentences.",
    "What are the pros and cons of {t}?",
    "Write a haiku about {t}.",
    "How would you explain {t} in one sentence?",
    "Suggest a reading list for someone curious about {t}.",
    "Write a friendly tweet about {t}.",
    "What questions would you ask an expert on {t}?",
]


def first_sentence(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    para = re.sub(r"\s+", " ", para).strip()
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    s = m.group(1) if m else para
    return s[:240]


def signature(fn: ast.FunctionDef) -> str:
    args = [a.arg for a in fn.args.posonlyargs + fn.args.args if a.arg not in ("self", "cls")]
    if fn.args.vararg:
        args.append("*" + fn.args.vararg.arg)
    args += [a.arg for a in fn.args.kwonlyargs]
    if fn.args.kwarg:
        args.append("**" + fn.args.kwarg.arg)
    return f"{fn.name}({', '.join(args)})"


def stdlib_functions():
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        rel = path.relative_to(root)
        if any(p.startswith(("test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages")) for p in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        module = ".".join(rel.with_suffix("").parts).replace(".__init__", "")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 30:
                    yield module, node, first_sentence(doc)


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    with gzip.open(sys.argv[2], "rt", encoding="utf-8") as f:
        human_eval_names = {json.loads(line)["entry_point"] for line in f if line.strip()}
    rng = random.Random(20261121)
    seen = set(human_eval_names)
    code = []
    for module, fn, doc in stdlib_functions():
        if fn.name in seen or len(doc.split()) < 5:
            continue
        seen.add(fn.name)
        d = doc[0].lower() + doc[1:]
        t = rng.choice(CODE_TEMPLATES)
        code.append(t.format(sig=signature(fn), name=fn.name, qual=f"{module}.{fn.name}", doc=d, doc_short=d.rstrip(".")))
    chat = [t.format(t=topic) for topic in TOPICS for t in CHAT_TEMPLATES]
    rng.shuffle(code)
    rng.shuffle(chat)
    code = code[:1200]
    rows = [{"kind": "code", "prompt": p} for p in code] + [{"kind": "chat", "prompt": p} for p in chat]
    rng.shuffle(rows)
    with out.open("w", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": i, **r}, ensure_ascii=False) + "\n")
    print(f"{len(rows)} prompts ({len(code)} code, {len(chat)} chat) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
