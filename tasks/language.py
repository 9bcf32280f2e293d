"""A fixed, closed vocabulary for task instructions.

Every observation carries its instruction as ``int64`` token ids of fixed length
:data:`MAX_TOKENS` (padded with :data:`PAD`), so a policy can condition on language without a
tokenizer download. The vocabulary is small on purpose: it covers what the tasks say, ours
(:data:`CORE_VOCAB`) and then the words of the suites' task names (:data:`SUITE_WORDS`: Meta-World's
50 tasks, robosuite's Lift, Stack and Door), appended after ours so that our words keep their ids.
"""

from __future__ import annotations

import numpy as np

PAD = 0
UNK = 1
MAX_TOKENS = 12

CORE_VOCAB: tuple[str, ...] = (
    "<pad>",
    "<unk>",
    "move",
    "reach",
    "the",
    "gripper",
    "to",
    "push",
    "pick",
    "up",
    "and",
    "place",
    "it",
    "at",
    "on",
    "onto",
    "open",
    "close",
    "drawer",
    "cube",
    "target",
    "goal",
    "red",
    "green",
    "blue",
    "yellow",
    "purple",
    "orange",
    "above",
    "table",
    "marker",
)
# The words of tasks.suites' instructions that ours lack ("button press topdown", "peg insert
# side"...), in alphabetical order; tests/suites checks that every suite task's words are here.
SUITE_WORDS: tuple[str, ...] = (
    "assembly", "back", "basketball", "bin", "box", "button", "coffee", "dial", "disassemble",
    "door", "faucet", "hammer", "hand", "handle", "hole", "insert", "into", "lever", "lock", "of",
    "out", "peg", "picking", "plate", "press", "pull", "shelf", "side", "slide", "soccer", "stick",
    "sweep", "topdown", "turn", "unlock", "unplug", "wall", "window",
)
VOCAB: tuple[str, ...] = CORE_VOCAB + SUITE_WORDS
CORE_SIZE = len(CORE_VOCAB)
VOCAB_SIZE = len(VOCAB)
_INDEX = {word: i for i, word in enumerate(VOCAB)}


def tokenize(text: str, strict: bool = True) -> np.ndarray:
    """Turn an instruction into ``MAX_TOKENS`` int64 token ids, padded with :data:`PAD`.

    Args:
        text: The instruction, words separated by spaces (case and trailing dots ignored).
        strict: Raise on words outside the vocabulary instead of mapping them to :data:`UNK`.

    Returns:
        An ``int64`` array of shape ``(MAX_TOKENS,)``.

    Raises:
        ValueError: A word is not in the vocabulary (strict) or the instruction is too long.
    """
    words = text.lower().replace(".", " ").replace(",", " ").split()
    if len(words) > MAX_TOKENS:
        raise ValueError(f"instruction {text!r} has {len(words)} words; at most {MAX_TOKENS} fit")
    ids = np.full(MAX_TOKENS, PAD, dtype=np.int64)
    for i, word in enumerate(words):
        if word not in _INDEX:
            if strict:
                raise ValueError(f"word {word!r} of {text!r} is not in the vocabulary {VOCAB[2:]}")
            ids[i] = UNK
        else:
            ids[i] = _INDEX[word]
    return ids


def detokenize(ids: np.ndarray) -> str:
    """Inverse of :func:`tokenize` (padding dropped)."""
    return " ".join(VOCAB[int(i)] for i in np.asarray(ids).ravel() if int(i) != PAD)
