"""Does ``lexical_rerank`` improve retrieval on CANARD? The project's CANARD benchmark, re-ranked.

    .venv/bin/python plugins/ragchat-lexical-rerank/bench/bench_canard_rerank.py
    .venv/bin/python plugins/ragchat-lexical-rerank/bench/bench_canard_rerank.py --weights 0,0.3,0.5
    .venv/bin/python plugins/ragchat-lexical-rerank/bench/bench_canard_rerank.py --quick

Run from the repository root with the plugin installed. It imports ``bench/bench_canard.py``
for the data, the passages, the follow-up turns and the transformed queries (see that module
for the setup). For every follow-up turn and query variant (raw, transformed, gold) the
profile's ``retrieval_k`` candidates (or ``--candidates``) are searched as the ``vector``
retriever does (``search_vectors`` then ``fetch_chunks``), then ``LexicalRerank.process``
re-orders them, once per ``weight`` (``weight=0`` keeps the vector order: the baseline).
Reported: recall at 1, at the profile's ``top_k`` (what reaches the prompt) and at 5, for each
split of the benchmark.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import bench_canard
from bench._setup import bench_database, machine, table

VARIANTS = ("raw", "transformed", "gold")
DEFAULT_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def rerank_all(items, weights, candidates: int) -> dict[float, dict]:
    """{weight: {id(item): {variant: ranked chunk ids}}}: every item's candidates re-ranked."""
    from django_ragchat.models import Conversation
    from django_ragchat.profiles import get_profile
    from django_ragchat.stages.retrievers import fetch_chunks, search_vectors
    from django_ragchat.turn.context import TurnContext, components_for
    from django_ragchat.types import Query

    from ragchat_lexical_rerank import LexicalRerank

    profile = get_profile()
    embedder = components_for(profile).embedder
    texts = sorted({t for item in items for t in item.texts.values() if t})
    vectors = dict(zip(texts, embedder.embed(texts)))
    found = {text: fetch_chunks(search_vectors(embedder.space, vectors[text], candidates), "vector")
             for text in texts}
    rerankers = {w: LexicalRerank(profile, weight=w) for w in weights}
    turn = TurnContext(conversation=Conversation(profile=profile.name), profile=profile,
                       components=components_for(profile), question="")
    ranked: dict[float, dict] = {w: {} for w in weights}
    for item in items:
        for weight, reranker in rerankers.items():
            ranked[weight][id(item)] = {
                variant: [c.chunk_id for c in reranker.process(Query(text=text), list(found[text]), turn)]
                if text else []
                for variant, text in item.texts.items()
            }
    return ranked


def recall(items, ranked: dict, variant: str, k: int) -> float:
    return sum(item.target in ranked[id(item)][variant][:k] for item in items) / len(items)


def splits(items, dialogs: int, tune_dialogs: int) -> dict[str, list]:
    """The benchmark's splits: tuning dialogs, held-out dialogs, all."""
    return {
        f"tune (dialogs 1-{min(tune_dialogs, dialogs)})": [i for i in items if i.dialog_index < tune_dialogs],
        f"held out ({tune_dialogs + 1}-{dialogs})": [i for i in items if i.dialog_index >= tune_dialogs],
        f"all {dialogs}": items,
    }


def report(split_items: dict[str, list], ranked: dict, ks: tuple[int, ...], top_k: int) -> str:
    rows = []
    for split, items in split_items.items():
        if not items:
            continue
        for weight, by_item in ranked.items():
            label = "vector only" if weight == 0 else f"rerank w={weight:g}"
            rows.append([split if weight == 0 else "", len(items), label,
                         *[f"{recall(items, by_item, v, k):.3f}" for v in VARIANTS for k in ks]])
    headers = ["follow-up turns", "n", "ranking",
               *[f"{v} @{k}{' (top_k)' if k == top_k else ''}" for v in VARIANTS for k in ks]]
    return table(headers, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=lambda s: tuple(float(w) for w in s.split(",")), default=DEFAULT_WEIGHTS,
                        help="comma-separated rerank weights; 0 (the vector baseline) is always included")
    parser.add_argument("--index", default="heading", choices=list(bench_canard.INDEX_MODES))
    parser.add_argument("--candidates", type=int, default=None,
                        help="vector candidates re-ranked per query (default: the profile's retrieval_k)")
    parser.add_argument("--quick", action="store_true", help="12 dialogs: a smoke run")
    args = parser.parse_args(argv)
    weights = tuple(dict.fromkeys((0.0, *args.weights)))
    dialogs, tune_dialogs = (12, 8) if args.quick else (None, bench_canard.TUNE_DIALOGS)
    with bench_database() as database:
        from django_ragchat.profiles import get_profile

        profile = get_profile()
        candidates = args.candidates or profile.retrieval_k
        data = bench_canard.load_dialogs(limit=dialogs)
        passages = bench_canard.store_passages(data, args.index)
        try:
            items = bench_canard.follow_ups(data, passages)
            ranked = rerank_all(items, weights, candidates)
        finally:
            bench_canard.remove_passages(data)
        ks = tuple(sorted({1, profile.top_k, 5}))
        print(f"CANARD retrieval with lexical_rerank: {len(passages)} answer spans "
              f"({bench_canard.INDEX_MODES[args.index]}); {candidates} vector candidates per "
              f"query re-ranked; recall at k (top_k = {profile.top_k} reach the prompt)")
        print(f"{database}; {machine()}")
        print()
        print(report(splits(items, len(data), tune_dialogs), ranked, ks, profile.top_k))


if __name__ == "__main__":
    main()
