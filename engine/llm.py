"""The offline API: ``LLM(model=...).generate(prompts, sampling_params)``, as in vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

Prompt = str | list[int]
Conversation = list[dict[str, Any]]


class LLM:
    """Generate for a list of prompts with continuous batching; ``model=None`` is the default.

    Keyword arguments are ``EngineConfig`` fields (dtype, max_num_seqs, max_num_batched_tokens,
    max_model_len, block_size, enable_prefix_caching, kv_cache_memory_bytes, ...).
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self._counter = 0

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt (text or token ids) to completion; outputs in input order."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        return self._run(list(prompts), sampling_params, use_tqdm, priority, add_special=True)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template and generate a reply."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        prompts: list[Prompt] = [
            tok.encode(
                tok.apply_chat_template(list(c), add_generation_prompt=add_generation_prompt),
                add_special_tokens=False,
            )
            for c in conversations  # type: ignore[union-attr]
        ]
        return self._run(prompts, sampling_params, use_tqdm, None, add_special=False)

    def _run(
        self,
        prompts: list[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        priority: Sequence[int] | None,
        add_special: bool,
    ) -> list[RequestOutput]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(params_list)} sampling_params for {len(prompts)} prompts"
                )
        ids = []
        for i, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
            request_id = f"llm-{self._counter}"
            self._counter += 1
            self.engine.add_request(
                request_id, prompt, params, priority[i] if priority else 0, add_special
            )
            ids.append(request_id)
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), disable=not use_tqdm, unit="req", desc="generate")
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                results[out.request_id] = out
                bar.update(1)
        bar.close()
        return [results[i] for i in ids]
