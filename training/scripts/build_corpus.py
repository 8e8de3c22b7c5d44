"""Builds training/data/prompts.jsonl: the prompt corpus for verifier training.

Every prompt names its kind (code or chat) and its source:
- code, `stdlib-docstrings`: requests built from the docstrings and signatures of public
  functions in CPython's own standard library (read with `ast`, nothing imported);
- chat, `topic-templates`: question templates over a hand-written topic list;
- code, `python-faq`: the questions of Python's FAQ as people asked them (Debian's
  python3.11-doc, PSF licence), with "(Python)" added where the question does not say it;
- code, `perl-faq`: the questions of perlfaq1-9 (Debian's perl-doc, the Perl licence), with
  "(Perl)" added likewise;
- chat, `debian-faq-questions`: the questions of the Debian FAQ (Debian's debian-faq);
- chat, `debian-faq-passages`: summarising, extraction and rewriting requests over the Debian
  FAQ's answer paragraphs.
The FAQ sources are everyday questions and requests in their askers' words, closer to chat
traffic than the two templated sources; they come from Debian's archive, one of the registries
these machines reach. The first two sources keep their ids and order; the others follow them.
Deterministic: the same Python version and package versions give the same file. HumanEval (the
evaluation set) is not used here; a test checks that the corpus shares no function names or long
word runs with it.

Usage: python3 build_corpus.py OUT.jsonl HUMANEVAL.jsonl.gz [DOCS_ROOT]
(the HumanEval file is `$APPROXY_HOME/data/HumanEval.jsonl.gz`, provided by `approxy setup`;
its function names are excluded so no training prompt asks for a HumanEval function).
DOCS_ROOT is a directory the three Debian packages are unpacked into; without it they are
fetched with `apt-get download` into a temporary directory.
"""
import ast
import gzip
import json
import pathlib
import random
import re
import subprocess
import sys
import sysconfig
import tempfile

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


DEBIAN_PACKAGES = ["python3.11-doc", "perl-doc", "debian-faq"]

PASSAGE_TEMPLATES = [
    "Summarize this in one sentence:\n\n{p}",
    "List the main points of the following text as short bullet points.\n\n{p}",
    "Extract the names of the people, projects, programs and releases this text mentions, one per line.\n\n{p}",
    "Rewrite this in plain words for someone who has never used Linux:\n\n{p}",
    "Write a short question that this paragraph answers, then answer it in two sentences.\n\n{p}",
]


def unpack_debian_docs(root: pathlib.Path) -> None:
    """Fetches the packages from Debian's archive and unpacks them into `root`."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", *DEBIAN_PACKAGES], cwd=tmp, check=True)
        for deb in sorted(pathlib.Path(tmp).glob("*.deb")):
            print(f"unpacking {deb.name}", file=sys.stderr)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)


def python_faq(root: pathlib.Path):
    """The section titles that are questions in Python's FAQ (reST sources)."""
    for path in sorted(root.glob("usr/share/doc/python3.11/html/_sources/faq/*.rst.txt")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for title, underline in zip(lines, lines[1:]):
            title = title.strip()
            if title.endswith("?") and re.fullmatch(r"([-=~^\"])\1{3,}", underline.strip()):
                q = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", title).replace("``", "`")
                yield q if "python" in q.lower() else q + " (Python)"


def perl_faq(root: pathlib.Path):
    """The questions (=head2 titles) of perlfaq1-9 (POD sources)."""
    for path in sorted(root.glob("usr/share/perl/*/pod/perlfaq[1-9].pod")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("=head2 ") and line.rstrip().endswith("?"):
                q = line[len("=head2 "):].strip()
                q = q.replace("E<lt>", "<").replace("E<gt>", ">")
                q = re.sub(r"C<<+\s*(.+?)\s*>+>", r"`\1`", q)
                q = re.sub(r"C<([^<>]+)>", r"`\1`", q)
                q = re.sub(r"[IBFL]<([^<>]+)>", r"\1", q)
                yield q if "perl" in q.lower() else q + " (Perl)"


def debian_faq(root: pathlib.Path):
    """The Debian FAQ's questions, and its answer paragraphs of 300 to 900 characters."""
    with gzip.open(root / "usr/share/doc/debian/FAQ/debian-faq.en.txt.gz", "rt", encoding="utf-8") as f:
        lines = f.read().replace("\xa0", " ").splitlines()
    questions = [
        re.sub(r"^\d+\.\d+\.?\s+", "", l).strip()
        for l in lines
        if re.match(r"^\d+\.\d+\.? .*\?\s*$", l)
    ]
    passages, block = [], []
    for line in lines + [""]:
        if line.strip():
            block.append(line)
            continue
        # Body paragraphs are indented four spaces; lists, code and headings are not.
        if block and all(l.startswith("    ") and not l.startswith("     ") for l in block):
            text = re.sub(r"\s+", " ", " ".join(l.strip() for l in block))
            if 300 <= len(text) <= 900 and text.count("http") <= 1:
                passages.append(text)
        block = []
    return questions, passages


def faq_rows(root: pathlib.Path, seen_prompts: set, rng: random.Random):
    questions, passages = debian_faq(root)
    sources = [
        ("code", "python-faq", list(python_faq(root))),
        ("code", "perl-faq", list(perl_faq(root))),
        ("chat", "debian-faq-questions", questions),
        ("chat", "debian-faq-passages", [rng.choice(PASSAGE_TEMPLATES).format(p=p) for p in passages]),
    ]
    rows = []
    for kind, source, prompts in sources:
        unique = [p for p in dict.fromkeys(prompts) if p not in seen_prompts]
        print(f"{source}: {len(unique)} prompts", file=sys.stderr)
        rng.shuffle(unique)
        rows += [{"kind": kind, "source": source, "prompt": p} for p in unique]
    return rows


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
    rows = [{"kind": "code", "source": "stdlib-docstrings", "prompt": p} for p in code] + [
        {"kind": "chat", "source": "topic-templates", "prompt": p} for p in chat
    ]
    rng.shuffle(rows)
    # A separate generator, so the sources above keep the order (and ids) they always had.
    faq_rng = random.Random(20261124)
    seen_prompts = {r["prompt"] for r in rows}
    if len(sys.argv) > 3:
        rows += faq_rows(pathlib.Path(sys.argv[3]), seen_prompts, faq_rng)
    else:
        with tempfile.TemporaryDirectory() as docs:
            unpack_debian_docs(pathlib.Path(docs))
            rows += faq_rows(pathlib.Path(docs), seen_prompts, faq_rng)
    with out.open("w", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": i, **r}, ensure_ascii=False) + "\n")
    kinds = {k: sum(r["kind"] == k for r in rows) for k in ("code", "chat")}
    print(f"{len(rows)} prompts ({kinds['code']} code, {kinds['chat']} chat) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
