"""Attention metadata for one step (the contract in DESIGN.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Where each sequence's new tokens are and which cache blocks they read and write.

    query_start_loc [num_seqs + 1] int32, seq_lens [num_seqs] int32 (context length after
    this step's tokens are appended), block_tables [num_seqs, max_blocks_per_seq] int32,
    slot_mapping [num_tokens] int64. ``max_query_len`` and ``max_seq_len`` are host ints so
    kernels can size their grids without reading device memory.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_seq_len: int
