"""The workloads validation sends: a long document-QA prompt with a known answer, and token-id prompts of exact lengths.

Everything is deterministic (seeded), so two validation runs send byte-identical prompts and results compare. The
document prompt mirrors the seed's 8507-token document-QA prompt: filler prose with one planted fact and a question
about it at the end, long enough to span several LMCache chunks. Its length is counted in whitespace-separated words
(what the CPU mock counts as tokens; a real tokenizer gives a similar count). The boundary check needs exact token
counts instead, so it sends lists of token ids, which OpenAI completions accept as the prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from glm53.chunks import require_positive
from glm53.errors import Glm53Error


def _split(text: str) -> list[str]:
    """Words as the CPU mock counts tokens: whitespace-separated."""
    return text.split()


DEFAULT_DOCUMENT_TOKENS = 8507  # the seed's document-QA prompt length

_WORDS = _split(
    "the quarterly ledger lists shipments received at the northern depot during winter while auditors compared "
    "invoices against warehouse counts and noted that several pallets of copper wire arrived late because the river "
    "crossing froze for nine days so the freight company rerouted trucks through the mountain pass and charged an "
    "additional fee which the finance office disputed in a letter to the regional manager who promised a review"
)
_HEAD = "Read the following audit document and answer the question at the end."
_FACT = "Note for the auditors: the reference code of ledger seven is {answer}."
_QUESTION = "Question: what is the reference code of ledger seven? Answer with the number only. Answer:"


@dataclass(frozen=True)
class QaPrompt:
    """A document-QA prompt: its text, its length in words, and the expected answer (None when not known)."""

    text: str
    words: int
    answer: str | None

    def is_correct(self, output: str) -> bool | None:
        """Whether a model's answer names the expected answer; None when the prompt came without one."""
        return None if self.answer is None else self.answer in output


def document_qa_prompt(tokens: int = DEFAULT_DOCUMENT_TOKENS, seed: int = 0) -> QaPrompt:
    """A deterministic document of exactly `tokens` words with one planted fact and a question about it at the end."""
    rng = random.Random(seed)
    answer = str(rng.randrange(1000, 10000))
    head = _split(_HEAD)
    fact = _split(_FACT.format(answer=answer))
    question = _split(_QUESTION)
    filler_words = require_positive(tokens, "document length") - len(head) - len(fact) - len(question)
    if filler_words < 2:
        raise Glm53Error(f"a document-QA prompt needs at least {tokens - filler_words + 2} tokens, got {tokens}")
    filler = _prose(rng, filler_words)
    split = filler_words * 2 // 5  # the fact sits two fifths in, far from both ends of the context
    words = [*head, *filler[:split], *fact, *filler[split:], *question]
    return QaPrompt(" ".join(words), len(words), answer)


def prompt_words() -> tuple[str, ...]:
    """Every word the document prompts are made of (filler, instructions, fact, question), in first-use order."""
    frame = _split(" ".join((_HEAD, _FACT.format(answer=""), _QUESTION)))
    return tuple(dict.fromkeys(w.strip(".?:") for w in [*_WORDS, *frame]))


def _prose(rng: random.Random, count: int) -> list[str]:
    """`count` words of sentence-like filler: random words, a capital and a full stop every 8-20 words."""
    words: list[str] = []
    while len(words) < count:
        sentence = [rng.choice(_WORDS) for _ in range(rng.randint(8, 20))]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        words += sentence
    return words[:count]


def prompt_from_file(path: Path) -> QaPrompt:
    """A user's own prompt (`--prompt-file`): the file's text as it is, with no known answer."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise Glm53Error(f"cannot read the prompt file {str(path)!r} ({error}); give a UTF-8 text file") from None
    if not text.strip():
        raise Glm53Error(f"the prompt file {str(path)!r} is empty; give the long document-QA prompt to validate with")
    return QaPrompt(text, len(text.split()), None)


def token_id_prompt(length: int, seed: int, id_range: tuple[int, int] = (1000, 30000)) -> list[int]:
    """Exactly `length` deterministic token ids from `id_range` (the profile's ordinary-token ids; the default is
    inside every GLM tokenizer's); different seeds give different prompts from the first token on."""
    rng = random.Random(f"glm53-boundary-{seed}")
    return [rng.randrange(*id_range) for _ in range(require_positive(length, "prompt length"))]


def boundary_lengths(chunk_size: int) -> tuple[int, ...]:
    """The nine lengths of seed 004's workload: one token either side of, and exactly on, the first three boundaries."""
    require_positive(chunk_size, "chunk size")
    return tuple(k * chunk_size + d for k in (1, 2, 3) for d in (-1, 0, 1) if k * chunk_size + d > 0)
