"""Answer quality of the offline default (the semantic one: the wordllama embedder, the extractive
answerer reading with it), beside today's (the hashing embedder and the word-only extractive
answerer with the language tables it had before issue 25), per document collection.

    .venv/bin/python bench/bench_extractive.py                      # every collection's tuning set, CANARD, cost
    .venv/bin/python bench/bench_extractive.py --collection sample_docs --show tuning
    .venv/bin/python bench/bench_extractive.py --heldout            # also the held-out sets: run ONCE, never read
    .venv/bin/python bench/bench_extractive.py --no-canard
    .venv/bin/python bench/bench_extractive.py --no-canard --no-cost --dump answers.jsonl  # to diff two versions

1. **Labelled sets**, per collection ``bench/data/<collection>/`` (``bench/data/README.md``): its
   ``subjects.json`` names the subjects an answer may be off on ({name: regular expression}, or
   a list of names matched as written), alone or as ``"subjects"`` beside ``"docs"`` (a folder,
   relative to the repository or to the collection; default ``docs/`` beside it); its
   ``tuning.jsonl`` may be read and tuned on, every ``heldout*.jsonl`` is only run (``--heldout``)
   and never printed. The documents are ingested with ``ingest_paths`` (and re-embedded into the
   baseline's space), and each question runs through the whole pipeline (follow-ups after their
   ``history`` turns in the same conversation) once per answerer, each in its own conversations:

   - ``new``: the default profile (``wordllama`` when the semantic extra is installed);
   - ``baseline``: the ``hashing`` embedder and the answerer with no model, reading the language
     files of before issue 25 (``bench/data/baseline_lang/en``: the same words, unpruned).

   Reported per answerer and split: *fact stated* (answerable questions whose answer contains
   every fact), *false declines*, *declined plainly* (not-covered questions answered with a plain
   decline naming no other subject), *off-subject* (answers naming a subject the question is not
   about), *mean words*.

2. **CANARD** (``bench/data/canard_dev_150.jsonl``, loaded as ``bench/bench_canard.py`` does): for
   every follow-up turn whose answer span is stored, the top 4 passages for the transformed
   query (each answerer's own embedder and transformer) are given to it; a hit is an answer that
   quotes a sentence of the turn's gold span. Baseline: the first sentence of the top passage.

3. **Cost**: each answerer's own time per turn at 4 passages (the prompts recorded in part 1),
   measured in the same process (wall and CPU time), with the passages read from their text and
   the sentence caches cleared before each call ("cold") and not ("warm"); and with the passages
   as the search fetched them, each with the reading stored in its row at ingestion (decoded in
   the call), the caches cleared before each call ("cold, read at ingestion": a new question
   over passages this process has never read).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import ROOT, bench_database, machine, table
from django_ragchat import hookimpl

DATA_DIR = Path(__file__).resolve().parent / "data"
#: The English language files as they were before issue 25 cut the tables (the baseline reads them).
BASELINE_LANG = DATA_DIR / "baseline_lang" / "en"
DECLINE_RE = re.compile(
    r"\b(?:don't|do not|doesn't|does not) (?:say|mention|cover)|can't answer|cannot answer|couldn't find"
    r"|could not find|no information", re.IGNORECASE)
CITATION_RE = re.compile(r"\s?\[\d+\]")
ANSWERERS = ("new", "baseline")
# CANARD's questions are open ("What else is interesting?"): the share of the asked words a
# sentence must state is also reported at this looser setting a profile can choose.
LOOSE = 0.25

RECORDED: dict[str, list] = {"new": [], "baseline": []}


def recording(name: str):
    """The extractive answerer under the name ``bench_<name>``, recording each prompt it answers
    in ``RECORDED[name]`` (for the cost measurement). Built when the plugin registers, after
    Django is configured."""
    from django_ragchat.stages.llms import ExtractiveAnswerer  # noqa: PLC0415 - needs configured settings

    class Recording(ExtractiveAnswerer):
        def explained(self, prompt):
            RECORDED[name].append(prompt)
            return super().explained(prompt)

    Recording.name = f"bench_{name}"
    Recording.__name__ = Recording.__qualname__ = f"Recording{name.title()}"
    return Recording


@hookimpl
def register_llm_backends(register):
    # The default answerer, and the same class in the baseline profile (no model there: it
    # reads words only).
    for name in ANSWERERS:
        register(recording(name))


# The recording answerers are not named "extractive", so each profile says what the default
# profile's answerer implies: the query components read the synonym table too (the followup
# transformer's shop-policy rule, the synonyms expander). Without it the benchmark measured a
# profile the default is not (until 4 December 2026, from issue 21 on).
QUERY_SYNONYMS = {"query_synonyms": True}
BASELINE_PROFILE = {"embedder": "hashing", "vocabulary": {"directory": str(BASELINE_LANG), **QUERY_SYNONYMS}}
RAGCHAT = {
    "LOAD_ENTRY_POINTS": False,
    "PLUGINS": ["bench.bench_extractive"],
    "PROFILES": {"default": {}, "new": {"llm": "bench_new", "vocabulary": QUERY_SYNONYMS},
                 "baseline": {"llm": "bench_baseline", **BASELINE_PROFILE}},
}


@dataclass
class Collection:
    """A document collection with its labelled sets (``bench/data/<name>/``)."""

    name: str
    docs: Path
    subjects: dict[str, str]  # subject name -> regular expression naming it

    @classmethod
    def load(cls, name: str) -> Collection:
        folder = DATA_DIR / name
        spec = json.loads((folder / "subjects.json").read_text(encoding="utf-8"))
        if isinstance(spec, list) or not ({"subjects", "docs"} & set(spec)):
            spec = {"subjects": spec}  # the subjects alone: {name: pattern} or [name, ...]
        subjects = spec.get("subjects", {})
        if isinstance(subjects, list):
            subjects = {s: re.escape(s) for s in subjects}
        docs = spec.get("docs", "docs")
        path = next((p for p in (folder / docs, ROOT / docs) if p.exists()), folder / docs)
        return cls(name, path, {n: (p or re.escape(n)) for n, p in subjects.items()})

    def split_files(self, heldout: bool) -> list[Path]:
        """``tuning.jsonl``, and with ``heldout`` every ``heldout*.jsonl`` (only run, never read here)."""
        folder = DATA_DIR / self.name
        files = [folder / "tuning.jsonl"]
        return files + (sorted(folder.glob("heldout*.jsonl")) if heldout else [])

    def names(self, answer: str, subject: str) -> bool:
        return bool(re.search(self.subjects.get(subject, re.escape(subject)), answer, re.IGNORECASE))


def collections() -> list[str]:
    """Every collection under bench/data/ (a folder with subjects.json and tuning.jsonl)."""
    return sorted(p.parent.name for p in DATA_DIR.glob("*/subjects.json") if (p.parent / "tuning.jsonl").exists())


def load_set(collection: Collection, heldout: bool = False) -> list[dict]:
    """The labelled questions of ``collection``; each item's ``split`` is the file it came from."""
    items = []
    for path in collection.split_files(heldout):
        with open(path, encoding="utf-8") as f:
            items += [{**json.loads(line), "split": path.stem} for line in f if line.strip()]
    # Answers are keyed by id: a held-out line sharing a tuning line's id would overwrite it.
    repeated = sorted(key for key, n in Counter(i["id"] for i in items).items() if n > 1)
    if repeated:
        raise SystemExit(f"{collection.name}: ids used twice across its sets: {repeated[:5]} ...")
    return items


# --- Scoring ------------------------------------------------------------------------------------


def plain(answer: str) -> str:
    return CITATION_RE.sub("", answer)


def states(answer: str, fact: str) -> bool:
    text = plain(answer).lower()
    return any(alternative.strip().lower() in text for alternative in fact.split("|"))


def declined(answer: str) -> bool:
    return bool(DECLINE_RE.search(answer))


def judge(item: dict, answer: str, collection: Collection) -> dict:
    is_decline = declined(answer)
    # A decline that names the subject the user named ("...a colour swap for Zephyr Buds" after
    # "I bought Zephyr Buds last week") states nothing of another subject (rule added in stop 19,
    # before fresh11 and fresh12 were first run; their writer flagged such avoid lists).
    said = " ".join([*item["history"], item["question"]])
    avoid = [p for p in item["avoid"] if not (is_decline and collection.names(said, p))]
    return {
        "answerable": not item["not_covered"],
        "fact": (not item["not_covered"] and not is_decline and all(states(answer, f) for f in item["facts"])),
        "declined": is_decline,
        "off": any(collection.names(answer, p) for p in avoid),
        "words": len(plain(answer).split()),
    }


def summarise(judged: list[dict]) -> list:
    answerable = [j for j in judged if j["answerable"]]
    uncovered = [j for j in judged if not j["answerable"]]

    def share(items, key, negate=False):
        if not items:
            return "n/a"
        hits = sum(bool(i[key]) != negate for i in items)
        return f"{hits}/{len(items)} {hits / len(items):.0%}"

    plain_declines = [dict(j, ok=j["declined"] and not j["off"]) for j in uncovered]
    return [
        share(answerable, "fact"), share(answerable, "declined"), share(plain_declines, "ok"),
        share(judged, "off"), f"{sum(j['words'] for j in judged) / max(1, len(judged)):.1f}",
    ]


# --- Part 1: the labelled sets ------------------------------------------------------------------


def ingest(collection: Collection) -> None:
    """The collection's documents, in the new default's space and the baseline's."""
    from django_ragchat.ingestion.pipeline import ingest_paths, reembed
    from django_ragchat.plugins import embedder_for
    from django_ragchat.profiles import get_profile

    ingest_paths([collection.docs], profile="new")
    reembed(embedder_for(get_profile("baseline")))


def run_labelled(items: list[dict]) -> dict[str, dict[str, str]]:
    """{answerer: {item id: answer}} through the whole pipeline of each answerer's profile."""
    from django_ragchat.models import Conversation
    from django_ragchat.turn.pipeline import run_turn_sync

    answers: dict[str, dict[str, str]] = {a: {} for a in ANSWERERS}
    finals: dict[str, str] = {}
    for answerer in ANSWERERS:
        for item in items:
            conversation = Conversation.objects.create(profile=answerer)
            for earlier in item["history"]:
                run_turn_sync(conversation, earlier)
            result = run_turn_sync(conversation, item["question"])
            answers[answerer][item["id"]] = result.message["content"]
            if answerer == "new":
                finals[item["id"]] = ((result.trace or {}).get("queries") or {}).get("final", "")
    answers["_final_query"] = finals
    return answers


def labelled_report(items: list[dict], answers: dict[str, dict[str, str]], collection: Collection) -> str:
    rows = []
    for split in dict.fromkeys(i["split"] for i in items):
        part = [i for i in items if i["split"] == split]
        for answerer in ANSWERERS:
            judged = [judge(i, answers[answerer][i["id"]], collection) for i in part]
            rows.append([f"{split} ({len(part)})", answerer, *summarise(judged)])
    headers = ["split", "answerer", "fact stated", "false declines", "declined plainly", "off-subject", "mean words"]
    return table(headers, rows)


def dump(path: Path, name: str, items: list[dict], answers: dict[str, dict[str, str]]) -> None:
    """Append each tuning item's answers to ``path``, one JSON line each (held-out ones never)."""
    with open(path, "a", encoding="utf-8") as f:
        for item in items:
            if item["split"].startswith("heldout"):
                continue
            f.write(json.dumps({"collection": name, "id": item["id"], "question": item["question"],
                                **{a: answers[a][item["id"]] for a in ANSWERERS}}, ensure_ascii=False) + "\n")


def show(items: list[dict], answers: dict[str, dict[str, str]], split: str, collection: Collection) -> str:
    lines = []
    for item in items:
        if item["split"] != split or item["split"].startswith("heldout"):
            continue  # a held-out split is never printed: reading it would spoil it
        new = answers["new"][item["id"]]
        j = judge(item, new, collection)
        ok = (j["declined"] and not j["off"]) if item["not_covered"] else (j["fact"] and not j["off"])
        lines.append(f"{'ok ' if ok else 'BAD'} {item['id']} {' / '.join(item['history'] + [item['question']])}"
                     f"   [final: {answers['_final_query'][item['id']]}]")
        lines.append(f"      new: {new}")
        lines.append(f"      baseline: {answers['baseline'][item['id']]}")
    return "\n".join(lines)


# --- Part 2: CANARD -----------------------------------------------------------------------------


def _canard_answers(answerer_profile: str, dialogs: int | None, passages_per_turn: int) -> tuple[list, dict]:
    """(the follow-ups, {name: [answer per follow-up]}) with ``answerer_profile``'s embedder,
    transformer and answerer (at its own min_coverage and at ``LOOSE``)."""
    from django.test.utils import override_settings

    from bench import bench_canard
    from django_ragchat.answerer.passages import build_passages
    from django_ragchat.models import Chunk
    from django_ragchat.plugins import embedder_for
    from django_ragchat.profiles import get_profile
    from django_ragchat.stages.llms import ExtractiveAnswerer
    from django_ragchat.turn.context import components_for
    from django_ragchat.types import Prompt, RetrievedChunk

    config = {k: v for k, v in RAGCHAT["PROFILES"][answerer_profile].items() if k != "llm"}
    with override_settings(RAGCHAT={**RAGCHAT, "PROFILES": {**RAGCHAT["PROFILES"], "default": config}}):
        data = bench_canard.load_dialogs(limit=dialogs)
        stored = bench_canard.store_passages(data, "heading")
        try:
            items = bench_canard.follow_ups(data, stored)
            bench_canard.rank_all(items, passages_per_turn)
            ids = {cid for item in items for cid in item.ranked["transformed"]}
            chunks = {c.pk: c for c in Chunk.objects.filter(pk__in=ids).select_related("document")}
        finally:
            bench_canard.remove_passages(data)
        profile = get_profile()
        vocabulary = components_for(profile).vocabulary
        embedder = embedder_for(profile)
        answerers = {"": ExtractiveAnswerer(profile, vocabulary=vocabulary, embedder=embedder),
                     f", min_coverage {LOOSE}": ExtractiveAnswerer(profile, vocabulary=vocabulary, embedder=embedder,
                                                                   min_coverage=LOOSE)}
        outputs: dict[str, list[str]] = {f"{answerer_profile}{suffix}": [] for suffix in answerers}
        firsts = []
        for item in items:
            docs = tuple(
                RetrievedChunk(chunk_id=c.pk, text=c.text, score=1.0, document_id=c.document_id,
                               source=c.document.source, title=c.document.title, heading=c.heading)
                for c in (chunks[cid] for cid in item.ranked["transformed"]))
            prompt = Prompt(messages=(), question=item.texts["raw"], search_query=item.texts["transformed"] or
                            item.texts["raw"], documents=docs)
            for suffix, answerer in answerers.items():
                outputs[f"{answerer_profile}{suffix}"].append(answerer.answer(prompt))
            sentences_ = build_passages(docs[:1], vocabulary)[0].sentences if docs else ()
            firsts.append(sentences_[0].text if sentences_ else "")
        outputs[f"first sentence of top passage ({answerer_profile})"] = firsts
    return items, outputs


def run_canard(dialogs: int | None = None, passages_per_turn: int = 4) -> dict:
    from bench import bench_canard

    data = bench_canard.load_dialogs(limit=dialogs)
    span_of = {(d["dialog_id"], t["turn"]): t["answer"] or "" for d in data for t in d["turns"]}
    outputs: dict[str, list[str]] = {}
    items: list = []
    for answerer in ANSWERERS:
        items, found = _canard_answers(answerer, dialogs, passages_per_turn)
        outputs.update(found)
    counts = dict.fromkeys(outputs, 0)
    declines = {name: 0 for name in outputs if not name.startswith("first")}
    splits = {"tune": dict.fromkeys(counts, 0), "held out": dict.fromkeys(counts, 0)}
    sizes = {"tune": 0, "held out": 0}
    for n, item in enumerate(items):
        gold = _fold(span_of[(item.dialog_id, item.turn)])
        split = "tune" if item.dialog_index < bench_canard.TUNE_DIALOGS else "held out"
        sizes[split] += 1
        for name, answers in outputs.items():
            hit = _quotes(answers[n], gold)
            counts[name] += hit
            splits[split][name] += hit
            if name in declines:
                declines[name] += declined(answers[n])
    return {"n": len(items), "counts": counts, "declines": declines, "splits": splits, "sizes": sizes}


def _fold(text: str) -> str:
    return " ".join(re.findall(r"\w+", plain(text).lower()))


def _quotes(answer: str, gold: str) -> bool:
    """True when a sentence of ``answer`` is part of the gold span (or contains all of it)."""
    if not answer or not gold or declined(answer):
        return False
    for sentence in re.split(r"(?<=[.!?])\s+", plain(answer)):
        folded = _fold(sentence)
        if len(folded) >= 8 and (folded in gold or gold in folded):
            return True
    return False


def canard_report(results: dict) -> str:
    rows = []
    for split, counts in results["splits"].items():
        n = results["sizes"][split]
        rows.append([f"{split} ({n})", *(f"{counts[name] / max(1, n):.1%}" for name in counts)])
    n = results["n"]
    rows.append([f"all ({n})", *(f"{v / max(1, n):.1%}" for v in results["counts"].values())])
    headers = ["CANARD follow-ups", *results["counts"]]
    return table(headers, rows) + "\ndeclined: " + ", ".join(
        f"{name} {count}/{n}" for name, count in results["declines"].items())


# --- Part 3: cost -------------------------------------------------------------------------------


def measure_cost(repeats: int = 20) -> str:
    # The plugin module's RECORDED: this one may be running as __main__.
    from bench import bench_extractive as registered
    from django_ragchat.answerer.semantic import clear_caches
    from django_ragchat.profiles import get_profile
    from django_ragchat.turn.context import components_for

    answerers = {name: components_for(get_profile(name)).llm for name in ANSWERERS}
    stored = {name: [p for p in registered.RECORDED[name] if len(p.documents) == 4] for name in ANSWERERS}
    if not all(stored.values()):
        return "no prompt with 4 passages recorded"
    # The first two rows as they were measured before chunks were read at ingestion: every
    # passage read from its text in the turn. The last row: the passages as the search fetched
    # them, with the reading stored in their rows (decoded in the turn), the caches cleared.
    plain = {name: [_without_analysis(p) for p in prompts] for name, prompts in stored.items()}
    with_stored = sum(bool(d.analysis) for p in stored["new"] for d in p.documents)
    rows = []
    for label, prompts, cold in (("cold (sentence caches cleared)", plain, True), ("warm", plain, False),
                                 ("cold, read at ingestion (cleared)", stored, True)):
        timings, cpu = {}, {}
        for name, answerer in answerers.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(repeats):
                for prompt in prompts[name]:
                    if cold:
                        clear_caches()
                    answerer.answer(prompt)
            timings[name] = (time.perf_counter() - started) / (repeats * len(prompts[name])) * 1000
            cpu[name] = (time.process_time() - started_cpu) / (repeats * len(prompts[name])) * 1000
        rows.append([label, *(f"{timings[n]:.3f}" for n in ANSWERERS), f"{timings['new'] / timings['baseline']:.2f}",
                     *(f"{cpu[n]:.3f}" for n in ANSWERERS)])
    return (f"{len(stored['new'])} and {len(stored['baseline'])} recorded prompts with 4 passages (new, baseline), "
            f"each answered {repeats} times; {with_stored} of the new one's {4 * len(stored['new'])} passages "
            f"carry a reading stored at ingestion\n"
            + table(["per turn", *(f"{n} ms" for n in ANSWERERS), "new/baseline", *(f"{n} cpu ms" for n in ANSWERERS)],
                    rows))


def _without_analysis(prompt):
    """``prompt`` with its passages as they were before a reading was stored with them."""
    return dataclasses.replace(prompt, documents=tuple(dataclasses.replace(d, analysis=None) for d in prompt.documents))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collection", action="append", choices=collections(),
                        help="a collection under bench/data/ (repeatable; default every one)")
    parser.add_argument("--heldout", action="store_true",
                        help="also run the held-out sets (heldout*.jsonl): once, at the end; never printed")
    parser.add_argument("--show", choices=("tuning",), help="print the answers of the tuning set (never a held-out one)")
    parser.add_argument("--no-canard", action="store_true")
    parser.add_argument("--dialogs", type=int, default=None, help="CANARD dialogs to use (default all 150)")
    parser.add_argument("--dump", type=Path, default=None,
                        help="write every tuning answer to this file, one JSON line each (to diff two runs)")
    parser.add_argument("--no-cost", action="store_true", help="skip part 3 (the answerer's cost)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="part 3: times each recorded 4-passage prompt is answered (default 20)")
    args = parser.parse_args(argv)
    if args.dump and args.heldout:
        parser.error("--dump writes tuning answers only: it cannot be used with --heldout")
    if args.dump:
        args.dump.write_text("", encoding="utf-8")
    from django.test.utils import override_settings

    with bench_database() as database, override_settings(RAGCHAT=RAGCHAT):
        from django_ragchat.models import Document

        started = time.perf_counter()
        for name in args.collection or collections():
            collection = Collection.load(name)
            items = load_set(collection, args.heldout)
            ingest(collection)
            try:
                answers = run_labelled(items)
            finally:
                Document.objects.all().delete()
            print(f"Answers over {collection.docs.relative_to(ROOT)} ({name}): {len(items)} questions "
                  f"({sum(not i['not_covered'] for i in items)} answerable, {sum(i['not_covered'] for i in items)} "
                  f"not covered); {database}; {machine()}")
            print()
            print(labelled_report(items, answers, collection))
            if args.dump:
                dump(args.dump, name, items, answers)
            if args.show:
                print()
                print(show(items, answers, args.show, collection))
            print()
        if not args.no_cost:
            print(measure_cost(args.repeats))
        if not args.no_canard:
            print()
            print(canard_report(run_canard(args.dialogs)))
        print(f"\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
