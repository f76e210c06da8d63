"""Prompt and scoring functions for the in-context recall task configs (referenced from the YAMLs).

The prompt is the source passage followed by the question rewritten as a cloze prefix, so that a model
that can recall what it just read completes it with the answer span; the score is "contains": 1 when any
gold answer occurs (case-insensitive, literal) in the greedy continuation cut at the first newline.
These are the mechanics of the recall suite of the "Based" / "Just read twice" line of work (upstream
lm-eval's swde / fda / squad_completion score the same way).
"""

from __future__ import annotations

import re

_TRIVIAQA_MARKERS = re.compile(r"\[PAR\]|\[DOC\]|\[TLE\]")


def contains(prediction: str, answers: list[str]) -> float:
    """1.0 if any non-empty answer occurs in `prediction` (case-insensitive, literal), else 0.0."""
    low = prediction.lower()
    return float(any(a.strip() and a.strip().lower() in low for a in answers))


def _cloze(context: str, question: str) -> str:
    """Passage, then the cloze question. Some rows end their passage with the question: drop the repeat."""
    context, question = context.strip(), question.strip()
    while question and context.lower().endswith(question.lower()):
        context = context[: -len(question)].rstrip()
    return context.strip().rstrip(".") + ". " + question


def doc_to_text(doc: dict) -> str:
    return _cloze(doc["context"], doc["question"])


def doc_to_text_triviaqa(doc: dict) -> str:
    """TriviaQA passages carry the source's section markers ([PAR], [DOC], [TLE]); strip them."""
    return _cloze(_TRIVIAQA_MARKERS.sub("", doc["context"]), doc["question"])


def doc_to_target(doc: dict) -> str:
    """The first gold answer (used only for few-shot examples; scoring accepts any answer)."""
    answers = list(doc["answers"])
    return answers[0] if answers else "unanswerable"


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"contains": contains(results[0], list(doc["answers"]))}
