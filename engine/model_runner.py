"""Runs one step: all scheduled tokens of all sequences in one flattened forward pass."""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.models.llama import LlamaForCausalLM
from engine.ops import Ops
from engine.scheduler import SchedulerOutput


class ModelRunner:
    """Owns the model and the KV cache tensors; turns a ``SchedulerOutput`` into logits."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        ops: Ops,
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.ops = ops
        cfg = model.config
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        # Per layer: key_cache and value_cache [num_blocks, block_size, num_kv_heads, head_dim].
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(cfg.num_hidden_layers)
        ]

    def prepare(
        self, sched: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the step's tokens; returns input_ids, positions, metadata, logit rows."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logit_rows: list[int] = []
        for req, num_new in sched.scheduled:
            start = req.num_computed_tokens
            end = start + num_new
            tokens = req.all_token_ids
            input_ids.extend(tokens[start:end])
            positions.extend(range(start, end))
            block_ids = req.block_ids
            slots.extend(block_ids[p // bs] * bs + p % bs for p in range(start, end))
            starts.append(starts[-1] + num_new)
            seq_lens.append(end)
            tables.append(block_ids)
            if end == req.num_tokens:
                logit_rows.append(starts[-1] - 1)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        dev = self.device
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            max_query_len=max(n for _, n in sched.scheduled),
            max_seq_len=max(seq_lens),
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos, meta, logit_rows

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> torch.Tensor:
        """Run the step; float32 logits [num_sampling_rows, vocab] for the requests that sample
        (those whose scheduled tokens reach the end of their known tokens), in batch order."""
        ids, pos, meta, logit_rows = self.prepare(sched)
        hidden = self.model(ids, pos, self.kv_caches, meta, self.ops)
        if not logit_rows:
            return hidden.new_empty((0, self.model.config.vocab_size), dtype=torch.float32)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=self.device)
        return self.model.compute_logits(hidden[rows])
