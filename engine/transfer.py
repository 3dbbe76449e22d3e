"""Host-to-device copies that never make the host wait for the GPU."""

from __future__ import annotations

import torch


def copy_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The CPU tensor ``host`` on ``device``; on CUDA through pinned memory and a non-blocking
    copy. A blocking copy (``.to(device)``, ``torch.tensor(values, device=...)``) synchronizes
    the stream: the host would wait for every kernel queued before it, and asynchronous
    scheduling queues the next step's forward before this step's sampling and inputs."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
