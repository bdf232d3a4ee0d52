"""Drafters: each proposes tokens for the target to verify. One file per drafter, all behind the
`Drafter` protocol and built by name from the registry (`make_drafter`)."""

from specwise.drafters.base import DRAFTERS, Draft, Drafter, make_drafter, register
from specwise.drafters.model import ModelDrafter
from specwise.drafters.ngram import NgramDrafter
from specwise.drafters.suffix import SuffixDrafter

__all__ = [
    "DRAFTERS",
    "Draft",
    "Drafter",
    "ModelDrafter",
    "NgramDrafter",
    "SuffixDrafter",
    "make_drafter",
    "register",
]
