"""The labelled set and the rates measured on it (used by the tests and scripts/evaluate.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.resources import files

from ragchat_prompt_guard.detect import DEFAULT_THRESHOLD, Assessment, assess


def load_labelled() -> list[dict]:
    """Rows of ``data/labelled.jsonl``: ``text``, ``label`` (benign/hostile), ``split`` (dev/holdout)."""
    text = files("ragchat_prompt_guard").joinpath("data/labelled.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass
class Evaluation:
    hostile: int = 0
    detected: int = 0
    benign: int = 0
    false_alarms: int = 0
    errors: list[tuple[dict, Assessment]] = field(default_factory=list)

    @property
    def detection_rate(self) -> float:
        return self.detected / self.hostile if self.hostile else 0.0

    @property
    def false_positive_rate(self) -> float:
        return self.false_alarms / self.benign if self.benign else 0.0


def evaluate(rows: list[dict], threshold: float = DEFAULT_THRESHOLD) -> Evaluation:
    result = Evaluation()
    for row in rows:
        assessment = assess(row["text"])
        flagged = assessment.is_injection(threshold)
        if row["label"] == "hostile":
            result.hostile += 1
            result.detected += flagged
            if not flagged:
                result.errors.append((row, assessment))
        else:
            result.benign += 1
            result.false_alarms += flagged
            if flagged:
                result.errors.append((row, assessment))
    return result
