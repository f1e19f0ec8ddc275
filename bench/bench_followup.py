"""Follow-ups that switch subjects: does the offline ``followup`` transformer search the right
product and does the answer state what was asked?

    .venv/bin/python bench/bench_followup.py              # 48 conversations x 3 variants, ~1 minute
    .venv/bin/python bench/bench_followup.py --misses     # also list the turns each variant gets wrong
    .venv/bin/python bench/bench_followup.py --quick      # a smoke run

Data: ``bench/data/followup_conversations.jsonl`` (labelled by hand before tuning; see
``bench/data/README.md``) over ``example_project/sample_docs/`` and ``bench/data/followup_catalogue/``.
Each corpus is ingested with ``ingest_text`` on its own (its conversations are played with only
that corpus stored, as on a site that has only its own catalogue), then removed.

Every conversation is played through the real pipeline (``run_turn_sync``, default profile: the
hashing embedder, in-process search, the extractive answerer) so each turn's history holds the
answers the product really gave. Three variants of the profile, in the same process:

* ``none``: no query transformer (the question is searched as typed);
* ``before``: ``followup`` with ``track_subjects: False``, the transformer as it was before issue
  13 (names from the history appended; no subject/attribute tracking);
* ``after``: ``followup`` as shipped.

Per turn: **doc@1**, the first retrieved document is the labelled one; **answer**, the answer
contains one of the labelled strings. Reported for every follow-up turn (turn >= 2), for the
turns after a switch (``switch_*`` and ``pronoun_after_switch``), and for the turns that must
inherit the attribute (``switch_inherit``, ``switch_back``), per split (``tune``/``heldout``) and
corpus.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, median, table

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "followup_conversations.jsonl"
CORPORA = {
    "sample": ROOT / "example_project" / "sample_docs",
    "catalogue": ROOT / "bench" / "data" / "followup_catalogue",
}
VARIANTS = {
    "none": {"query_transformers": []},
    "before": {"options": {"followup": {"track_subjects": False, "carry_opening": False}}},
    "after": {},
}
AFTER_SWITCH = {"switch_inherit", "switch_new", "switch_back", "pronoun_after_switch"}
INHERITS = {"switch_inherit", "switch_back"}


@dataclass
class TurnOutcome:
    conversation: str
    corpus: str
    split: str
    index: int
    kind: str
    question: str
    doc: str
    expect: list[str]
    searched: str = ""
    first_doc: str = ""
    answer: str = ""
    notes: list[str] = field(default_factory=list)
    transform_ms: float = 0.0

    @property
    def doc_ok(self) -> bool:
        return self.first_doc == self.doc

    @property
    def answer_ok(self) -> bool:
        return any(e.casefold() in self.answer.casefold() for e in self.expect)


def load_conversations(path: Path = DATA) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def ingest_corpus(corpus: str) -> None:
    """Every markdown file of ``corpus``, sourced as ``<corpus>/<file name>``."""
    from django_ragchat.ingestion.pipeline import ingest_text

    for path in sorted(CORPORA[corpus].glob("*.md")):
        ingest_text(f"{corpus}/{path.name}", path.read_text(encoding="utf-8"), content_type="markdown")


def remove_corpus(corpus: str) -> None:
    from django_ragchat.models import Document

    Document.objects.filter(source__startswith=f"{corpus}/").delete()


def _default_overrides() -> dict:
    """The default profile's settings in force (``run(embedder=...)`` changes them)."""
    from django_ragchat.conf import ragchat_settings

    return dict(ragchat_settings.PROFILES.get("default") or {})


def play(conversations: list[dict], profile_overrides: dict) -> list[TurnOutcome]:
    """Play every conversation through ``run_turn_sync`` with the default profile changed by
    ``profile_overrides``; one ``TurnOutcome`` per turn."""
    from django.test import override_settings

    from django_ragchat.models import Conversation
    from django_ragchat.turn.pipeline import run_turn_sync

    outcomes = []
    with override_settings(RAGCHAT={"LOAD_ENTRY_POINTS": False, "PROFILES": {"default": profile_overrides}}):
        for conv in conversations:
            conversation = Conversation.objects.create(session_key="bench-followup")
            for index, turn in enumerate(conv["turns"]):
                result = run_turn_sync(conversation, turn["q"])
                documents = result.trace.get("documents") or []
                first = Path(documents[0]["source"]).stem if documents else ""
                steps = result.trace["queries"].get("transformed", [])
                outcomes.append(TurnOutcome(
                    conversation=conv["id"], corpus=conv["corpus"], split=conv["split"], index=index,
                    kind=turn["kind"], question=turn["q"], doc=turn["doc"], expect=turn["expect"],
                    searched=result.trace["queries"].get("final", turn["q"]), first_doc=first,
                    answer=result.answer, notes=[s.get("note", "") for s in steps],
                    transform_ms=result.trace.get("timings", {}).get("query_transformers", 0.0),
                ))
    return outcomes


def run(*, limit: int | None = None, embedder: str | None = None) -> dict:
    """Ingest, play every variant; returns {"variants": {name: [TurnOutcome]}, "seconds"}.
    ``embedder`` replaces the default profile's for the whole run (ingestion and every variant)."""
    from django.test import override_settings

    if embedder:
        with override_settings(RAGCHAT={"LOAD_ENTRY_POINTS": False, "PROFILES": {"default": {"embedder": embedder}}}):
            return {**run(limit=limit), "embedder": embedder}
    started = time.perf_counter()
    conversations = load_conversations()
    results: dict[str, list[TurnOutcome]] = {name: [] for name in VARIANTS}
    for corpus in CORPORA:
        selected = [c for c in conversations if c["corpus"] == corpus][:limit]
        ingest_corpus(corpus)
        try:
            for name, overrides in VARIANTS.items():
                results[name] += play(selected, {**_default_overrides(), **overrides})
        finally:
            remove_corpus(corpus)
    return {"variants": results, "conversations": len({o.conversation for o in results["after"]}),
            "seconds": time.perf_counter() - started}


def _rate(items: list[TurnOutcome], attr: str) -> str:
    if not items:
        return "-"
    return f"{sum(getattr(i, attr) for i in items) / len(items):.0%}"


SUBSETS = {
    "follow-ups (turn >= 2)": lambda o: o.index > 0,
    "after a switch": lambda o: o.kind in AFTER_SWITCH,
    "inheriting the attribute": lambda o: o.kind in INHERITS,
    "fresh starts": lambda o: o.kind == "fresh",
    "a topic's own page after a product": lambda o: o.kind == "topic",
}


def report(results: dict, database: str) -> str:
    lines = [
        f"Follow-up subject switches: {results['conversations']} conversations, embedder "
        f"{results.get('embedder') or 'of the default profile'}, variants "
        f"{', '.join(results['variants'])}; {database}; {machine()}; {results['seconds']:.1f} s", "",
    ]
    headers = ["split", "corpus", "turns", *[f"{v} doc@1 / answer" for v in results["variants"]]]
    for subset, keep in SUBSETS.items():
        rows = []
        for split in ("tune", "heldout"):
            for corpus in ("sample", "catalogue", "both"):
                cells = []
                n = 0
                for outcomes in results["variants"].values():
                    items = [o for o in outcomes if keep(o) and o.split == split and corpus in ("both", o.corpus)]
                    n = len(items)
                    cells.append(f"{_rate(items, 'doc_ok')} / {_rate(items, 'answer_ok')}")
                rows.append([split, corpus, n, *cells])
        lines += [subset, table(headers, rows), ""]
    # The transformer stage's cost on follow-up turns (the subject lookup is one cached query).
    baseline = median([o.transform_ms for o in results["variants"]["before"] if o.index]) or float("nan")
    cost = [[name, f"{median([o.transform_ms for o in outcomes if o.index]):.3f}",
             f"{median([o.transform_ms for o in outcomes if o.index]) / baseline:.2f}x"]
            for name, outcomes in results["variants"].items()]
    lines += ["query transformer stage on follow-up turns (median ms, ratio to 'before')",
              table(["variant", "median ms", "vs before"], cost), ""]
    return "\n".join(lines)


def misses(results: dict, variant: str) -> str:
    lines = [f"Turns {variant!r} gets wrong (doc@1 or answer):"]
    for o in results["variants"][variant]:
        if o.index and not (o.doc_ok and o.answer_ok):
            lines += [f"- {o.conversation} #{o.index + 1} [{o.kind}, {o.split}] {o.question}",
                      f"    searched: {o.searched}",
                      f"    first: {o.first_doc} (want {o.doc}); answer ok: {o.answer_ok}: {o.answer[:140]}",
                      f"    note: {'; '.join(o.notes)}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--misses", action="append", default=[], help="list a variant's misses (repeatable)")
    parser.add_argument("--quick", action="store_true", help="3 conversations per corpus: a smoke run")
    parser.add_argument("--embedders", type=lambda s: s.split(","), default=[None],
                        help="comma-separated embedders, one run each in this process (e.g. hashing,wordllama)")
    args = parser.parse_args(argv)
    with bench_database() as database:
        for embedder in args.embedders:
            results = run(limit=3 if args.quick else None, embedder=embedder)
            print(report(results, database))
            for variant in args.misses:
                print(misses(results, variant))


if __name__ == "__main__":
    main()
