"""Tensor parallelism: the process group, the collectives a model shard needs, rank workers.

Rank 0 is the engine process: it schedules, samples and broadcasts every step's inputs.
Ranks 1..N-1 are worker processes started here (``spawn``); each builds its model shard,
then loops: receive a step, run the model (its all-reduces and the logits gather pair with
rank 0's), until the shutdown message. NCCL on CUDA (NVLink multicast off), gloo on CPU.
With ``tensor_parallel_size=1`` no group exists and every collective is the identity.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from engine.attention import AttentionMetadata
from engine.transfer import copy_to_device

if TYPE_CHECKING:
    from engine.config import EngineConfig

# NVLink multicast (NVLS) stays off in every rank: the lent machines cannot use it.
MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
STARTUP_TIMEOUT_S = 900
_CMD_STEP, _CMD_SHUTDOWN = 1, 2
_HEADER_LEN = 8


@dataclass
class TensorParallel:
    """This process's place in the tensor-parallel group (rank 0 of 1 when there is none)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, size: int, what: str) -> tuple[int, int]:
        """(start, length) of this rank's equal share of ``size``; ValueError if uneven."""
        if size % self.world_size:
            raise ValueError(
                f"{what} ({size}) must be divisible by tensor_parallel_size ({self.world_size})"
            )
        length = size // self.world_size
        return self.rank * length, length

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks in place (identity without a group)."""
        if self.is_enabled:
            dist.all_reduce(x)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """[rows, n] per rank -> [rows, n * world_size] on rank 0 (rank order), else None."""
        if not self.is_enabled:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0)
        return torch.cat(parts, dim=-1) if parts is not None else None

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks."""
        if not self.is_enabled:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    # ----------------------------------------------------------------- step broadcast
    def send_step(
        self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor
    ) -> None:
        """Rank 0: broadcast one step's inputs (ids, positions [num_tokens], metadata, rows)."""
        num_seqs, width = meta.block_tables.shape
        header = [_CMD_STEP, ids.numel(), num_seqs, width, rows.numel()]
        header += [meta.max_query_len, meta.max_seq_len, 0]
        self._broadcast_header(header)
        payload = torch.cat(
            [
                ids.long(),
                pos.long(),
                meta.query_start_loc.long(),
                meta.seq_lens.long(),
                meta.block_tables.long().flatten(),
                meta.slot_mapping.long(),
                rows.long(),
            ]
        )
        dist.broadcast(payload, src=0)

    def send_shutdown(self) -> None:
        """Rank 0: tell the workers to leave their step loop."""
        self._broadcast_header([_CMD_SHUTDOWN] + [0] * (_HEADER_LEN - 1))

    def recv_step(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor] | None:
        """Ranks > 0: the next step's (ids, positions, metadata, logit rows); None on shutdown."""
        header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        cmd, num_tokens, num_seqs, width, num_rows, max_query_len, max_seq_len, _ = header.tolist()
        if cmd == _CMD_SHUTDOWN:
            return None
        sizes = [num_tokens, num_tokens, num_seqs + 1, num_seqs, num_seqs * width, num_tokens]
        sizes.append(num_rows)
        payload = torch.empty(sum(sizes), dtype=torch.int64, device=self.device)
        dist.broadcast(payload, src=0)
        ids, pos, starts, seq_lens, tables, slots, rows = payload.split(sizes)
        meta = AttentionMetadata(
            query_start_loc=starts.int(),
            seq_lens=seq_lens.int(),
            block_tables=tables.reshape(num_seqs, width).int(),
            slot_mapping=slots.contiguous(),
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
        )
        return ids, pos, meta, rows

    def _broadcast_header(self, values: list[int]) -> None:
        # Not torch.tensor(..., device=): a blocking copy would hold rank 0's host until the
        # step in flight ends (asynchronous scheduling sends step n + 1 during step n).
        dist.broadcast(copy_to_device(torch.tensor(values, dtype=torch.int64), self.device), src=0)


def rank_device(base: torch.device, rank: int) -> torch.device:
    """Rank r runs on ``cuda:(base index + r)`` on CUDA, on the CPU otherwise."""
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


def init_rank(rank: int, world_size: int, device: torch.device, init_method: str) -> TensorParallel:
    """Join the group (NCCL on CUDA, gloo on CPU); returns this rank's ``TensorParallel``."""
    os.environ.update(MULTICAST_OFF_ENV)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # device_id binds NCCL's communicator to this rank's GPU at once.
    extra: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=STARTUP_TIMEOUT_S),
        **extra,
    )
    return TensorParallel(rank, world_size, device)


def _exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """A rank worker blocks in collectives; if the engine process dies (kill -9), leave."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="tp-parent-watch").start()


def _worker_main(rank: int, config: EngineConfig, init_method: str, parent_pid: int) -> None:
    """Entry point of ranks 1..N-1: build the shard, then run steps until shutdown."""
    from engine.model_runner import build_runner

    _exit_with_parent(parent_pid)
    world_size = config.tensor_parallel_size
    device = rank_device(config.resolve_device(), rank)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    tp = init_rank(rank, world_size, device, init_method)
    runner = None
    try:
        runner, _ = build_runner(config, tp)
        while runner.execute_remote():
            pass
    finally:
        if runner is not None:  # graphs that captured collectives would hang the teardown
            runner.release_cuda_graphs()
        dist.destroy_process_group()


@dataclass
class RankWorkers:
    """The worker processes of ranks 1..N-1 and rank 0's ``TensorParallel``."""

    tp: TensorParallel
    processes: list[Any]
    store_dir: str

    def stop(self, timeout_s: float = 60.0) -> None:
        """Leave the group while the workers leave theirs (after ``send_shutdown``), wait for
        them to exit and kill stragglers. Rank 0 leaves on a thread of its own, at the same
        time as the workers: NCCL's communicator teardown may wait for every rank's, so
        leaving only after the workers had exited would keep them in it until the timeout."""
        import threading

        leaving = None
        if dist.is_initialized():
            leaving = threading.Thread(
                target=dist.destroy_process_group, daemon=True, name="tp-leave"
            )
            leaving.start()
        for proc in self.processes:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.processes = []
        if leaving is not None:
            leaving.join(timeout_s)
            if leaving.is_alive():  # still in the teardown: its store stays until it ends
                return
        shutil.rmtree(self.store_dir, ignore_errors=True)


def start_rank_workers(config: EngineConfig) -> RankWorkers:
    """Spawn ranks 1..N-1 and join the group as rank 0 (blocks until every rank joined)."""
    import torch.multiprocessing as mp

    os.environ.update(MULTICAST_OFF_ENV)  # inherited by the spawned ranks
    world_size = config.tensor_parallel_size
    base = config.resolve_device()
    if base.type == "cuda":
        first = base.index or 0
        if first + world_size > torch.cuda.device_count():
            raise ValueError(
                f"tensor_parallel_size {world_size} from {base} needs GPUs {first}.."
                f"{first + world_size - 1}, this host has {torch.cuda.device_count()}"
            )
    if dist.is_initialized():
        raise ValueError("a process group already exists in this process; one TP engine at a time")
    store_dir = tempfile.mkdtemp(prefix="tidal-tp-")
    init_method = f"file://{os.path.join(store_dir, 'store')}"
    ctx = mp.get_context("spawn")
    processes = []
    for rank in range(1, world_size):
        proc = ctx.Process(
            target=_worker_main,
            args=(rank, config, init_method, os.getpid()),
            daemon=True,
            name=f"tp{rank}",
        )
        proc.start()
        processes.append(proc)
    tp = init_rank(0, world_size, rank_device(base, 0), init_method)
    return RankWorkers(tp, processes, store_dir)
