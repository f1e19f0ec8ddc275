"""Conversational retrieval quality on CANARD: does the offline follow-up transformer help?

    .venv/bin/python bench/bench_canard.py                 # all 150 dialogs, about 10 seconds
    .venv/bin/python bench/bench_canard.py --examples 15   # also print misses to learn from
    .venv/bin/python bench/bench_canard.py --quick

Data: ``bench/data/canard_dev_150.jsonl`` (CC BY-SA 4.0, see ``bench/data/README.md``).

Every answerable answer span of every dialog is stored as a passage (one ``Document`` per
dialog, one ``Chunk`` per span, embedded by the default profile's embedder). Then, for each
follow-up turn (turn >= 2) whose own answer is one of those passages, the passages are searched
with:

(a) ``raw``: the question as the user typed it;
(b) ``transformed``: the question after the default profile's query transformers saw the
    history, run by the pipeline's own ``transform_query`` stage on a real ``TurnContext``;
(c) ``gold``: the human rewrite (the ceiling).

The history is the dialog so far as a conversation would hold it: the title and section as one
opening user message ("Title: Section"), then each earlier question (user) and answer
(assistant). Search is the product's: the hashing embedder and ``search_vectors`` (in process
on SQLite). A hit is the turn's own span among the top k (exact passage match). "gap closed" is
(transformed - raw) / (gold - raw).

Tuning the follow-up transformer uses the first 100 dialogs (``tune``); the last 50
(``held out``) show whether a change generalises; ``all`` is every dialog.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, table

DATA = Path(__file__).resolve().parent / "data" / "canard_dev_150.jsonl"
TUNE_DIALOGS = 100
VARIANTS = ("raw", "transformed", "gold")
INDEX_MODES = {
    "heading": "with their heading line, as ragchat_ingest stores a section",
    "bare": "the bare span text",
}
KS = (1, 5)


@dataclass
class FollowUp:
    """One evaluated turn: its dialog's position, the three query texts and the target chunk."""

    dialog_index: int
    dialog_id: str
    turn: int
    texts: dict[str, str]
    target: int  # chunk id of this turn's own answer span
    ranked: dict[str, list[int]] | None = None


def load_dialogs(path: Path = DATA, limit: int | None = None) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        dialogs = [json.loads(line) for line in f if line.strip()]
    return dialogs[:limit] if limit else dialogs


def is_passage(turn: dict) -> bool:
    return bool(turn["answerable"] and turn["answer"])


def store_passages(dialogs: list[dict], index: str) -> dict[tuple[str, int], int]:
    """Store every answerable span as a chunk; returns {(dialog id, turn): chunk id}.

    ``index="heading"`` stores a span the way ``ragchat_ingest`` stores a chunk of a Wikipedia
    section: the heading path ("Frank Zappa > Disbandment") on the first line, then the text.
    ``index="bare"`` stores the span alone.
    """
    from django_ragchat.ingestion.chunking import format_heading
    from django_ragchat.models import Chunk, Document
    from django_ragchat.profiles import get_profile
    from django_ragchat.tokens import count_tokens
    from django_ragchat.turn.context import components_for

    embedder = components_for(get_profile()).embedder
    documents = Document.objects.bulk_create([
        Document(source=f"canard/{d['dialog_id']}", title=d["title"], checksum=d["dialog_id"][-64:],
                 content_type="text/plain")
        for d in dialogs
    ])
    spans = []
    for document, dialog in zip(documents, dialogs):
        heading = format_heading((dialog["title"], dialog["section"]))
        for turn in filter(is_passage, dialog["turns"]):
            text = f"{heading}\n{turn['answer']}" if index == "heading" else turn["answer"]
            spans.append((document.pk, dialog["dialog_id"], turn["turn"], heading, text))
    vectors = embedder.embed([text for *_, text in spans])
    chunks = Chunk.objects.bulk_create([
        Chunk(document_id=doc_id, ordinal=turn, text=text, heading=heading, space=embedder.space,
              embedding=vector, token_count=count_tokens(text))
        for (doc_id, _, turn, heading, text), vector in zip(spans, vectors)
    ])
    return {(dialog_id, turn): chunk.pk for (_, dialog_id, turn, _, _), chunk in zip(spans, chunks)}


def remove_passages(dialogs: list[dict]) -> None:
    from django_ragchat.models import Document

    Document.objects.filter(source__in=[f"canard/{d['dialog_id']}" for d in dialogs]).delete()


def history_of(dialog: dict, turn_number: int):
    """The conversation before ``turn_number`` as ``HistoryMessage`` objects, oldest first."""
    from django_ragchat.tokens import count_tokens
    from django_ragchat.types import HistoryMessage

    messages = [("user", f"{dialog['title']}: {dialog['section']}")]
    for turn in dialog["turns"]:
        if turn["turn"] >= turn_number:
            break
        messages += [("user", turn["question"]), ("assistant", turn["answer"] or "")]
    return [HistoryMessage(role=role, content=content, seq=seq, token_count=count_tokens(content))
            for seq, (role, content) in enumerate(messages, start=1)]


def transformed_query(question: str, history) -> str | None:
    """The search text after the default profile's query transformers, as the pipeline's
    ``transform_query`` stage computes it; ``None`` if a transformer skipped retrieval or
    ended the turn (counted as a miss)."""
    from asgiref.sync import async_to_sync

    from django_ragchat.models import Conversation
    from django_ragchat.profiles import get_profile
    from django_ragchat.turn.context import TurnContext, components_for
    from django_ragchat.turn.pipeline import _new_trace, transform_query

    profile = get_profile()
    # The conversation is never saved: transformers only read it for warnings.
    turn = TurnContext(conversation=Conversation(profile=profile.name), profile=profile,
                       components=components_for(profile), question=question, history=list(history))
    turn.trace = _new_trace(turn)
    ending = async_to_sync(transform_query)(turn)
    if ending is not None or turn.retrieval_skipped:
        return None
    return turn.query.text


def follow_ups(dialogs: list[dict], passages: dict[tuple[str, int], int]) -> list[FollowUp]:
    found = []
    for index, dialog in enumerate(dialogs):
        for turn in dialog["turns"]:
            if turn["turn"] < 2 or not is_passage(turn):
                continue
            history = history_of(dialog, turn["turn"])
            found.append(FollowUp(
                dialog_index=index, dialog_id=dialog["dialog_id"], turn=turn["turn"],
                texts={"raw": turn["question"], "transformed": transformed_query(turn["question"], history),
                       "gold": turn["rewrite"]},
                target=passages[(dialog["dialog_id"], turn["turn"])],
            ))
    return found


def rank_all(items: list[FollowUp], k: int, retriever: str = "vector") -> None:
    """Search the top ``k`` chunk ids for every variant of every follow-up (the product's path:
    the profile's embedder, then the ``vector`` retriever's search, or the ``hybrid`` one's:
    vector and full text fused by reciprocal rank)."""
    from django_ragchat.plugins import build_component
    from django_ragchat.profiles import get_profile
    from django_ragchat.stages.retrievers import search_vectors
    from django_ragchat.turn.context import components_for

    profile = get_profile()
    embedder = components_for(profile).embedder
    searcher = build_component(profile, "retriever", retriever)
    texts = sorted({t for item in items for t in item.texts.values() if t})
    vectors = dict(zip(texts, embedder.embed(texts)))

    def search(text: str) -> list[int]:
        if retriever == "hybrid":
            return [hit.chunk_id for hit in searcher.search(embedder.space, vectors[text], k, text=text)]
        return [cid for cid, _ in search_vectors(embedder.space, vectors[text], k)]

    for item in items:
        item.ranked = {variant: search(text) if text else [] for variant, text in item.texts.items()}


def recall(items: list[FollowUp], variant: str, k: int) -> float:
    if not items:
        return float("nan")
    return sum(item.target in item.ranked[variant][:k] for item in items) / len(items)


def run(*, dialogs: int | None = None, tune_dialogs: int = TUNE_DIALOGS, index: str = "heading",
        retriever: str = "vector") -> dict:
    """Store the passages (see ``store_passages`` for ``index``), transform and search every
    follow-up, remove the passages again; returns {"index", "passages", "items": [FollowUp],
    "splits": {name: [FollowUp]}, "tune_dialogs", "seconds"}."""
    started = time.perf_counter()
    data = load_dialogs(limit=dialogs)
    passages = store_passages(data, index)
    try:
        items = follow_ups(data, passages)
        rank_all(items, max(KS), retriever)
    finally:
        remove_passages(data)
    splits = {
        f"tune (dialogs 1-{min(tune_dialogs, len(data))})": [i for i in items if i.dialog_index < tune_dialogs],
        f"held out ({tune_dialogs + 1}-{len(data)})": [i for i in items if i.dialog_index >= tune_dialogs],
        f"all {len(data)}": items,
    }
    return {"index": index, "passages": len(passages), "items": items, "splits": splits, "tune_dialogs": tune_dialogs,
            "retriever": retriever, "seconds": time.perf_counter() - started}


# A raw-to-gold gap of fewer turns than this is noise; its ratio would be meaningless.
MIN_GAP_TURNS = 5


def gap_closed(items: list[FollowUp], k: int) -> str:
    raw, transformed, gold = (recall(items, v, k) for v in VARIANTS)
    if (gold - raw) * len(items) < MIN_GAP_TURNS:
        return "n/a"
    return f"{(transformed - raw) / (gold - raw):.0%}"


def report(results: dict, database: str) -> str:
    from django_ragchat.profiles import get_profile
    from django_ragchat.turn.context import components_for

    profile = get_profile()
    transformers = [t.name for t in components_for(profile).query_transformers]
    rows = []
    for name, items in results["splits"].items():
        if not items:
            continue
        rows.append([name, len(items),
                     *[f"{recall(items, v, k):.3f}" for k in KS for v in VARIANTS],
                     *[gap_closed(items, k) for k in KS]])
    skipped = sum(item.texts["transformed"] is None for item in results["items"])
    changed = sum(item.texts["transformed"] not in (None, item.texts["raw"]) for item in results["items"])
    headers = ["follow-up turns", "n", *[f"{v} @{k}" for k in KS for v in VARIANTS], *[f"gap closed @{k}" for k in KS]]
    return "\n".join([
        f"CANARD conversational retrieval: {results['passages']} answer spans indexed "
        f"({INDEX_MODES[results['index']]}); profile "
        f"{profile.name!r} (embedder {profile.embedder}, retriever {results['retriever']}, "
        f"query transformers {transformers})",
        f"{database}; {machine()}; {results['seconds']:.1f} s",
        "",
        table(headers, rows),
        "",
        f"The transformers changed {changed} of {len(results['items'])} questions; {skipped} skipped retrieval. "
        f"Gap closed: n/a when gold beats raw by fewer than {MIN_GAP_TURNS} turns.",
    ])


def examples(results: dict, count: int) -> str:
    """Turns of the tuning split where the gold rewrite finds the span at 1 and the transformed
    query does not: what the transformer should learn."""
    lines = ["", "Misses the gold rewrite gets right (tuning split):"]
    shown = 0
    for item in results["items"]:
        if item.dialog_index >= results["tune_dialogs"] or shown >= count:
            continue
        if item.target == item.ranked["gold"][:1][0] and item.target not in item.ranked["transformed"][:1]:
            lines += [f"- {item.dialog_id} turn {item.turn}",
                      f"    raw:         {item.texts['raw']}",
                      f"    transformed: {item.texts['transformed']}",
                      f"    gold:        {item.texts['gold']}"]
            shown += 1
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogs", type=int, default=None, help="only the first N dialogs")
    parser.add_argument("--examples", type=int, default=0, help="print N tuning-split misses")
    parser.add_argument("--index", type=lambda s: s.split(","), default=list(INDEX_MODES),
                        help="comma-separated passage formats: heading, bare (default both)")
    parser.add_argument("--embedders", type=lambda s: s.split(","), default=None,
                        help="comma-separated embedders to run one after the other in this process (default: the "
                             "default profile's; e.g. hashing,wordllama)")
    parser.add_argument("--plugins", type=lambda s: s.split(","), default=[],
                        help="comma-separated plugin modules to load (e.g. bench.static_candidate)")
    parser.add_argument("--retrievers", type=lambda s: s.split(","), default=["vector"],
                        help="comma-separated: vector (the default profile's), hybrid (vector + full text)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    parser.add_argument("--subject-blind", action="store_true",
                        help="also run the followup transformer with track_subjects off (its behaviour before "
                             "issue 13), in the same process, as the baseline")
    args = parser.parse_args(argv)
    if args.quick:
        args.dialogs = 12
    with bench_database() as database:
        from django.test import override_settings

        tune = TUNE_DIALOGS if not args.quick else 8
        for embedder in args.embedders or [None]:
            variants = {"": {}}
            if args.subject_blind:
                variants["followup track_subjects off: "] = {"options": {"followup": {"track_subjects": False}}}
            for index in args.index:
                for retriever in args.retrievers:
                    for label, overrides in variants.items():
                        default = {**overrides, **({"embedder": embedder} if embedder else {})}
                        with override_settings(RAGCHAT={"LOAD_ENTRY_POINTS": False, "PLUGINS": args.plugins,
                                                        "PROFILES": {"default": default}}):
                            results = run(dialogs=args.dialogs, tune_dialogs=tune, index=index, retriever=retriever)
                            print(label + report(results, database))
                        if args.examples:
                            print(examples(results, args.examples))
                        print()


if __name__ == "__main__":
    main()
