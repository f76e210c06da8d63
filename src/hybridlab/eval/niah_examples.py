"""The examples of the multilingual needle-in-a-haystack evaluation (OneRULER-style): tasks, needles, prompt
templates and haystack prompts fitted to a token length; kept apart from running and scoring them (`niah`).

Tasks (RULER's NIAH variants plus OneRULER's "none" answer; every instruction allows answering "none"):
- niah_single: one needle; asked for its key.               answers = [value]
- niah_multikey: the needle + 3 distractor needles with other keys; asked for the needle's key.
- niah_multivalue: 4 needles with the SAME key and different values; asked for all of them.
- niah_multiquery: 4 needles with distinct keys; asked for all four keys' values.
- niah_none: 4 distractor needles (OneRULER's count); asked for a key that has no needle.   answers = []

Needles: "The special magic number for {key} is: {value}." Keys are words from a word list (distinct
per example), values distinct random 7-digit numbers. THIS PROJECT'S CHOICE: the needle, instruction and
question templates are English for every language for now (OneRULER translates them); pass
`NiahTemplate`s per language to localise. OneRULER's own data (``hybridlab.eval.oneruler``: its
per-language prompts, key words, books and scoring, two-key multi-query) replaces all of these when
``oneruler`` is given; ``chat`` applies the evaluated model's chat template to the prompt (with
``enable_thinking=False`` where the template reads that variable, e.g. Qwen3's, so a reasoning model answers
at once instead of spending its answer budget on thinking). The haystack is contiguous text, as OneRULER's
books are: consecutive sentences of the language's text from a start drawn with the example's seed,
wrapping to the beginning if the text is too short. Every needle is inserted between haystack sentences at
a seeded uniform depth in [0, 1] (or `depth` for the queried needle).

Length: `target_tokens` is measured in the EVALUATED model's tokenizer on the full prompt (with its
special tokens): the largest number of haystack sentences whose prompt fits in `target_tokens` is
found by bisection on the real token count, so `context_tokens` <= target and is short of it by less
than about one haystack sentence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from hybridlab.errors import HybridlabError

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "niah_none")
N_DISTRACTORS = 3  # multikey: the queried needle + 3 distractors
N_NONE_DISTRACTORS = 4  # niah_none: OneRULER's 4 distractor needles, none of them with the asked key
N_MULTI = 4  # multivalue and multiquery

DEFAULT_WORDS = tuple("""apple river candle garden mirror pencil rocket violin harbor lantern meadow
falcon blanket compass marble orchard saddle thunder velvet walnut anchor basket cactus dolphin
emerald feather glacier helmet island jacket kettle ladder magnet needle oyster parrot quartz ribbon
spider tunnel umbrella volcano whistle yogurt zebra bamboo cherry dragon engine forest ginger hammer
iceberg jungle kiwi lemon mango nutmeg olive pepper quill raven salmon tiger""".split())


@dataclass(frozen=True)
class NiahTemplate:
    """Prompt pieces of one language (English by default)."""

    needle: str = "The special magic number for {key} is: {value}."
    instruction: str = ("Some special magic numbers are hidden within the following text. Make sure to "
                         "memorize them. If the number you are asked for is not in the text, answer none.")
    question_one: str = "What is the special magic number for {key} mentioned in the provided text?"
    question_all_values: str = "What are all the special magic numbers for {key} mentioned in the provided text?"
    question_many_keys: str = "What are the special magic numbers for {keys} mentioned in the provided text?"
    answer_prefix: str = "Answer:"
    none_word: str = "none"
    joiner: str = ", "


@dataclass(frozen=True)
class NiahExample:
    prompt: str
    answers: tuple[str, ...]  # expected values; empty for niah_none
    task: str
    lang: str
    context_tokens: int  # actual prompt length in the evaluated model's tokens
    depth: float  # depth of the queried needle (niah_none: of the first distractor)
    target_tokens: int = 0
    needle_depths: tuple[float, ...] = ()
    none_word: str = "none"
    scoring: str = "project"  # "project" (score_prediction) | "oneruler" (oneruler.score_oneruler)
    none_words: tuple[str, ...] = ()  # OneRULER's accepted none words
    chat: bool = False  # `prompt` is the chat-templated text (tokenise without adding special tokens)


def _n_tokens(tokenizer: Any, text: str, chat: bool = False) -> int:
    return len((tokenizer(text, add_special_tokens=False) if chat else tokenizer(text))["input_ids"])


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def template_takes_thinking(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads an ``enable_thinking`` variable (Qwen3's does): its source
    (a string, or a mapping of named templates) mentions the name."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(t) for t in template.values())
    return isinstance(template, str) and "enable_thinking" in template


def chat_prompt(tokenizer: Any, text: str) -> str:
    """``text`` as one user turn in the tokenizer's chat template, ready for the assistant's answer; a
    template that reads ``enable_thinking`` gets ``enable_thinking=False`` (answer without a thinking block),
    any other template is called without it."""
    if not has_chat_template(tokenizer):
        raise HybridlabError("the tokenizer has no chat template; build the example with chat=False")
    extra = {"enable_thinking": False} if template_takes_thinking(tokenizer) else {}
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True, **extra)


def _needles(task: str, rng: random.Random, words: Sequence[str], n_queries: int = N_MULTI):
    """(needle (key, value) list, queried keys, expected values); multiquery asks `n_queries` keys."""
    n_keys = {"niah_single": 1, "niah_multikey": 1 + N_DISTRACTORS, "niah_multivalue": 1,
              "niah_multiquery": n_queries, "niah_none": 1 + N_NONE_DISTRACTORS}[task]
    n_values = {"niah_single": 1, "niah_multikey": 1 + N_DISTRACTORS, "niah_multivalue": N_MULTI,
                "niah_multiquery": n_queries, "niah_none": N_NONE_DISTRACTORS}[task]
    if len(set(words)) < n_keys:
        raise HybridlabError(f"{task} needs {n_keys} distinct key words, the word list has {len(set(words))}")
    keys = rng.sample(sorted(set(words)), n_keys)
    values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), n_values)]
    if task == "niah_multivalue":
        return [(keys[0], v) for v in values], keys[:1], values
    if task == "niah_multiquery":
        return list(zip(keys, values)), keys, values
    if task == "niah_none":  # keys[0] is asked for and has no needle
        return list(zip(keys[1:], values)), keys[:1], []
    return list(zip(keys, values)), keys[:1], values[:1]  # single / multikey: the first needle is queried


def build_niah_example(tokenizer: Any, haystack: Sequence[str], *, task: str, lang: str, target_tokens: int,
                       seed: int, words: Sequence[str] = DEFAULT_WORDS, template: NiahTemplate | None = None,
                       depth: float | None = None, oneruler=None, chat: bool = False) -> NiahExample:
    """One example whose prompt is as long as possible within `target_tokens` of `tokenizer`.

    ``oneruler`` (a ``hybridlab.eval.oneruler.OneRulerLanguage``) switches to OneRULER's prompts, key words,
    two-key multi-query and scoring; ``chat`` wraps the prompt in the tokenizer's chat template (the
    length then counts the templated text).
    """
    if task not in TASKS:
        raise HybridlabError(f"unknown NIAH task {task!r}; choose from {TASKS}")
    sentences = [s.strip() for s in haystack if s and s.strip()]
    if not sentences:
        raise HybridlabError(f"no haystack text for {lang}; pass the language's monolingual sentences")
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise HybridlabError(f"needle depth must be in [0, 1], got {depth}")
    tpl = template or NiahTemplate()
    rng = random.Random(f"{seed}-{task}-{lang}-{target_tokens}")
    if oneruler is not None:
        words = oneruler.words
    needles, asked, answers = _needles(task, rng, words, n_queries=2 if oneruler is not None else N_MULTI)
    depths = [rng.random() for _ in needles]
    if depth is not None:
        depths[0] = depth
    start = rng.randrange(len(sentences))  # contiguous text from a seeded start (not shuffled sentences)
    if task == "niah_multiquery":
        question = tpl.question_many_keys.format(keys=tpl.joiner.join(asked))
    elif task == "niah_multivalue":
        question = tpl.question_all_values.format(key=asked[0])
    else:
        question = tpl.question_one.format(key=asked[0])
    if oneruler is not None:
        needle_texts = [oneruler.needle(k, v) for k, v in needles]
    else:
        needle_texts = [tpl.needle.format(key=k, value=v) for k, v in needles]

    def prompt_with(n: int) -> str:
        hay = [sentences[(start + i) % len(sentences)] for i in range(n)]
        # insert deepest-first so earlier insertions do not shift the later positions
        for d, text in sorted(zip(depths, needle_texts), key=lambda p: -p[0]):
            hay.insert(round(d * len(hay)), text)
        if oneruler is not None:
            text = oneruler.prompt(oneruler.sep.join(hay), list(asked))
        else:
            text = f"{tpl.instruction}\n\n{' '.join(hay)}\n\n{question}\n{tpl.answer_prefix}"
        return chat_prompt(tokenizer, text) if chat else text

    def size(n: int) -> int:
        return _n_tokens(tokenizer, prompt_with(n), chat)

    if size(0) > target_tokens:
        raise HybridlabError(f"target of {target_tokens} tokens is shorter than the prompt without haystack "
                             f"({size(0)} tokens); use a longer context length")
    lo, hi = 0, 1  # invariant: prompt_with(lo) fits; grow hi until it does not
    while size(hi) <= target_tokens:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if size(mid) <= target_tokens:
            lo = mid
        else:
            hi = mid
    prompt = prompt_with(lo)
    none = oneruler.none_words if oneruler is not None else ()
    return NiahExample(prompt=prompt, answers=tuple(answers), task=task, lang=lang,
                       context_tokens=_n_tokens(tokenizer, prompt, chat), depth=depths[0], target_tokens=target_tokens,
                       needle_depths=tuple(depths), none_word=none[0] if none else tpl.none_word,
                       scoring="oneruler" if oneruler is not None else "project", none_words=none, chat=chat)


def build_niah_suite(tokenizer: Any, haystacks: dict[str, Sequence[str]], *, tasks: Sequence[str] = TASKS,
                     lengths: Sequence[int], n_per_cell: int, seed: int, words: Sequence[str] = DEFAULT_WORDS,
                     templates: dict[str, NiahTemplate] | None = None, oneruler: dict | None = None,
                     chat: bool = False) -> list[NiahExample]:
    """Examples for every (language, task, length) cell, `n_per_cell` each (seeds seed, seed+1, ...).

    ``oneruler``: {lang: OneRulerLanguage} for OneRULER's prompts (its books are the haystack then).
    ``chat``: the model's chat template where its tokenizer has one (``NiahExample.chat`` says if applied)."""
    chat = chat and has_chat_template(tokenizer)
    return [build_niah_example(tokenizer, (oneruler[lang].sentences if oneruler else hay), task=task, lang=lang,
                               target_tokens=length, seed=seed + i, words=words,
                               template=(templates or {}).get(lang), oneruler=(oneruler or {}).get(lang), chat=chat)
            for lang, hay in haystacks.items() for task in tasks for length in lengths for i in range(n_per_cell)]
