"""The text corpus, shipped with the experiment: Shakespeare's sonnets 18, 29, 116 and 130 (1609,
public domain). No download."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Corpus", "load_corpus"]

_TEXT = Path(__file__).with_name("sonnets.txt")


@dataclass(frozen=True)
class Corpus:
    """The text as an array of character codes, and its vocabulary."""

    codes: np.ndarray
    vocabulary: str

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def __len__(self) -> int:
        return len(self.codes)


def load_corpus(path: Path = _TEXT) -> Corpus:
    """Read ``path`` and encode it, one code per character, in sorted vocabulary order."""
    text = path.read_text(encoding="utf-8")
    vocabulary = "".join(sorted(set(text)))
    index = {ch: i for i, ch in enumerate(vocabulary)}
    return Corpus(np.array([index[ch] for ch in text], dtype=np.int64), vocabulary)
