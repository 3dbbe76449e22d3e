"""tidal's continuous-batching engine (no celery, boto3 or redis in here).

``from engine import LLM, SamplingParams`` works as in vLLM; the heavy names are imported on
first use so that ``engine.block_pool`` and friends stay light to import.
"""

from typing import Any

from engine.outputs import CompletionOutput, Logprob, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "EngineConfig":
        from engine.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
