"""Measure the detector on the labelled set: detection and false-positive rates per split.

    python plugins/ragchat-prompt-guard/scripts/evaluate.py [--split dev|holdout|all] [--threshold 1.0] [-v]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ragchat_prompt_guard.evaluation import evaluate, load_labelled  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--split", default="all", choices=["dev", "holdout", "all"])
    parser.add_argument("--threshold", type=float, default=1.0)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every miss and false alarm")
    args = parser.parse_args()
    rows = load_labelled()
    splits = ["dev", "holdout"] if args.split == "all" else [args.split]
    for split in splits:
        result = evaluate([r for r in rows if r["split"] == split], args.threshold)
        print(f"{split:8s} hostile {result.detected}/{result.hostile} detected ({result.detection_rate:.1%}), "
              f"benign {result.false_alarms}/{result.benign} flagged ({result.false_positive_rate:.1%})")
        if args.verbose:
            for row, assessment in result.errors:
                print(f"   {row['label']:7s} score {assessment.score:4.2f} {list(assessment.signals)}  {row['text']!r}")


if __name__ == "__main__":
    main()
