"""zeroed_int32: one zero-filled buffer per (device, owner), reused until more is asked for."""

from __future__ import annotations

import torch

from kernels.scratch import zeroed_int32


def test_reused_per_owner_grown_on_demand_and_kept():
    cpu = torch.device("cpu")
    first = zeroed_int32(cpu, 10, "test-a")
    assert first.dtype == torch.int32 and first.numel() >= 10 and not first.any()
    assert zeroed_int32(cpu, first.numel(), "test-a") is first  # reused, not zeroed again
    assert zeroed_int32(cpu, 10, "test-b") is not first  # another owner's
    grown = zeroed_int32(cpu, first.numel() + 1, "test-a")
    assert grown is not first and grown.numel() > first.numel() and not grown.any()
    assert zeroed_int32(cpu, 10, "test-a") is grown
