"""The offline answerer's reasons (a trace's ``answerer``), as sentences for staff.

``AnswerSelector.explained`` records why an answer is what it is: the outcome, the asked words,
and for each search of the sentences that found none good enough the reason and the closest
sentence with its scores. These functions say it in words, for the trace's "Why this answer";
a value of an unexpected shape is left out, never an error (the trace may come from a plugin
or another version).
"""

from __future__ import annotations

from typing import Any

#: Why a search of the sentences found none (``Why.attempt``), in words; the closest sentence's
#: scores follow for the two that had one.
REASONS = {
    "no_sentence_on_subject": "No sentence of the passages is about {subjects}.",
    "no_amount": "The question asks for an amount, and no sentence on its subject states one.",
    "no_number": "The question asks for a number, and no sentence on its subject states one.",
    "no_sentence": "No sentence of the passages could answer it.",
}


def _quoted(values: Any) -> str:
    items = [str(v) for v in values if isinstance(v, (str, int, float))] if isinstance(values, list) else []
    return ", ".join(f"“{v}”" for v in items)


def _share(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) else "?"


def _number(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "?"


def _sentence(closest: dict, passages: dict[int, str]) -> str:
    """"sentence 2 of passage [1] (Loyalty card — Getting a card)"."""
    passage, position = closest.get("passage"), closest.get("sentence")
    place = f"sentence {position} of " if isinstance(position, int) else ""
    if not isinstance(passage, int):
        return f"{place}a passage".strip()
    name = passages.get(passage)
    return f"{place}passage [{passage}]" + (f" ({name})" if name else "")


def attempt_sentence(attempt: dict, thresholds: dict, subjects: str, passages: dict[int, str] | None = None) -> str:
    """One search that found no sentence good enough, and why."""
    reason, closest = attempt.get("reason"), attempt.get("closest")
    if not isinstance(closest, dict):
        return REASONS.get(reason, f"No sentence answered ({reason}).").format(subjects=subjects or "the subject")
    scores = f"matches {_share(closest.get('coverage'))} of the asked words by weight (synonyms count)"
    if "min_similarity" in thresholds:
        scores += f" and is {_number(closest.get('similarity'))} similar in meaning"
    if reason == "below_threshold" and "min_coverage" in thresholds:
        scores += f"; a sentence answers with at least {_share(thresholds['min_coverage'])} of them"
        if "min_similarity" in thresholds:
            scores += f" or a similarity of {_number(thresholds['min_similarity'])}"
    if reason == "none_in_window":
        return (f"The asker's own rows found are all dated outside the time asked; the closest other sentence, "
                f"{_sentence(closest, passages or {})}, is not theirs, so it does not say what they have then.")
    if reason == "other_topic":
        return (f"The closest, {_sentence(closest, passages or {})}, {scores}, but was taken for another topic: "
                f"under {_number(thresholds.get('other_topic_similarity'))} similar, and another passage's "
                f"heading is about what was asked.")
    return f"The closest, {_sentence(closest, passages or {})}, {scores}."


#: How the asker's rows quoted were picked by their dates (``Why.by_date``'s order).
BY_DATE = {
    "soonest": "the soonest of the asker's own rows still to come, by the dates they write",
    "window": "the asker's own rows dated {window}, earliest first",
    "earliest": "the asker's own rows, earliest first by the dates they write",
}


def _by_date(by_date: Any, rows: int) -> str:
    """"; it quotes the soonest of the asker's own rows still to come ..." or "" (also for one
    row listed from the earliest: one row has no order)."""
    if not isinstance(by_date, dict) or by_date.get("order") not in BY_DATE:
        return ""
    if by_date["order"] == "earliest" and rows < 2:
        return ""
    window = by_date.get("window") if isinstance(by_date.get("window"), str) else "in the time asked"
    return "; it quotes " + BY_DATE[by_date["order"]].format(window=window)


def _answered(why: dict, thresholds: dict, names: dict[int, str]) -> str:
    picked = [p for p in why.get("picked") or [] if isinstance(p, dict)]
    passages = sorted({p["passage"] for p in picked if isinstance(p.get("passage"), int)})
    text = f"Answered with {len(picked)} sentence{'s' if len(picked) != 1 else ''}"
    if passages:
        text += f" of passage{'s' if len(passages) != 1 else ''} " + ", ".join(
            f"[{n}]" + (f" ({names[n]})" if n in names else "") for n in passages)
    text += _by_date(why.get("by_date"), len(passages))
    parts = why.get("parts") if isinstance(why.get("parts"), dict) else {}
    if picked and why.get("asked"):
        of = "its part's" if parts else "the"
        # "matches", not "states": words and their synonyms, not what the sentence means
        text += f"; the first matches {_share(picked[0].get('coverage'))} of {of} asked words by weight (synonyms count)"
        if "min_similarity" in thresholds:
            text += f" and is {_number(picked[0].get('similarity'))} similar in meaning"
    text += "."
    if parts.get("unanswered"):
        text += f" {parts['unanswered']} of the question's {parts.get('asked', '?')} parts found no sentence."
    return text


def answerer_sentence(why: dict, passages: dict[int, str] | None = None) -> str:
    """The answerer's reasons in a few sentences; "" for an empty or unknown record.
    ``passages`` names the passages the model saw by their citation number, for the reader
    (only those they may read)."""
    if not isinstance(why, dict) or not why.get("outcome"):
        return ""
    thresholds = why.get("thresholds") if isinstance(why.get("thresholds"), dict) else {}
    subjects, asked = _quoted(why.get("subjects")), _quoted(why.get("asked"))
    attempts = [a for a in why.get("attempts") or [] if isinstance(a, dict)]
    reasons = list(dict.fromkeys(attempt_sentence(a, thresholds, subjects, passages) for a in attempts))
    opening = f"Asked about {asked}" + (f" of {subjects}" if subjects else "") + ". " if asked else ""
    outcome = why["outcome"]
    if outcome == "answered":
        return " ".join([opening + _answered(why, thresholds, passages or {}),
                         *(reasons if why.get("parts") else [])])
    if outcome == "unknown_subject":
        return f"Declined: the question names {_quoted(why.get('unknown'))}, which no passage is about."
    if outcome == "compared":
        return opening + "Compared: each subject's own sentence, for the reader to compare."
    if outcome == "no_passages":
        return "No passage had a sentence to answer from."
    missing = why.get("missing")
    missing = f"“{missing}”" if missing else "what was asked"
    if any(isinstance(p, dict) for p in why.get("picked") or []):
        # A part answered, the rest declined ("... The documents don't say anything about owns."):
        # "Declined" alone misread an answer that quotes sentences (a trial's note).
        return " ".join([opening + _answered(why, thresholds, passages or {}),
                         f"The rest declined: no sentence states {missing}.", *reasons])
    return " ".join([f"{opening}Declined: no sentence states {missing}.", *reasons])
