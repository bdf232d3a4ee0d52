"""Drafters: each proposes tokens for the target to verify. One file per drafter, all behind the
`Drafter` protocol and built by name from the registry (`make_drafter`)."""

from specwise.drafters.base import (
    DRAFT_MODEL,
    DRAFTERS,
    READS_STATES,
    Draft,
    Drafter,
    make_drafter,
    make_drafters,
    register,
)
from specwise.drafters.cascade import CascadeDrafter
from specwise.drafters.eagle import EagleDrafter
from specwise.drafters.heads import HeadsDrafter
from specwise.drafters.model import ModelDrafter, TextDrafter
from specwise.drafters.ngram import NgramDrafter
from specwise.drafters.suffix import SuffixDrafter

__all__ = [
    "DRAFTERS",
    "DRAFT_MODEL",
    "READS_STATES",
    "CascadeDrafter",
    "Draft",
    "Drafter",
    "EagleDrafter",
    "HeadsDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "SuffixDrafter",
    "TextDrafter",
    "make_drafter",
    "make_drafters",
    "register",
]
