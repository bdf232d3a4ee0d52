"""specwise: exact, measured, goodput-aware speculative decoding for local LLMs."""

from specwise.engine import Engine
from specwise.request import GenerationResult
from specwise.sampling import SamplingParams

__all__ = ["Engine", "GenerationResult", "SamplingParams"]
__version__ = "0.1.0"
