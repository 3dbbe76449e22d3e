"""Scheduler: budget use, chunked prefill, priority order, preemption order (exact)."""

import zlib

from engine.block_pool import BlockPool
from engine.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

BS = 4


def make_request(request_id, num_prompt, priority=0, arrival=0.0, max_tokens=8, base=None):
    base = 1000 * (zlib.crc32(request_id.encode()) % 1000) if base is None else base
    return Request(
        request_id,
        list(range(base, base + num_prompt)),
        SamplingParams(max_tokens=max_tokens),
        max_tokens,
        priority=priority,
        arrival_time=arrival,
    )


def make_scheduler(num_blocks=16, max_num_seqs=8, budget=32, caching=True):
    pool = BlockPool(num_blocks, enable_caching=caching)
    return Scheduler(KVCacheManager(pool, BS), max_num_seqs, budget), pool


def run_step(sched, token=7):
    """Stand in for the model: every request that reaches its end samples ``token``."""
    out = sched.schedule()
    for req in sched.update_after_step(out):
        req.output_token_ids.append(token)
    return out


def ids(out):
    return [(r.request_id, n) for r, n in out.scheduled]


def test_chunked_prefill_keeps_decodes_running():
    sched, _ = make_scheduler(budget=10)
    a = make_request("a", 3, arrival=0)
    sched.add_request(a)
    assert ids(run_step(sched)) == [("a", 3)]
    b = make_request("b", 25, arrival=1)
    sched.add_request(b)
    # a decodes 1 token; b takes the remaining 9 of the budget, then 9, then 7.
    assert ids(run_step(sched)) == [("a", 1), ("b", 9)]
    assert ids(run_step(sched)) == [("a", 1), ("b", 9)]
    assert b.output_token_ids == []
    out = run_step(sched)
    assert ids(out) == [("a", 1), ("b", 7)]
    assert b.output_token_ids == [7] and b.num_computed_tokens == 25


def test_priority_then_fcfs_and_max_num_seqs():
    sched, _ = make_scheduler(max_num_seqs=2, budget=100)
    sched.add_request(make_request("late-normal", 2, priority=1, arrival=0))
    sched.add_request(make_request("early-high", 2, priority=0, arrival=5))
    sched.add_request(make_request("later-high", 2, priority=0, arrival=6))
    out = run_step(sched)
    assert ids(out) == [("early-high", 2), ("later-high", 2)]
    assert [r.request_id for r in sched.waiting] == ["late-normal"]


def test_preemption_picks_lowest_priority_latest_arrival_and_recomputes():
    # 6 blocks of 4 tokens; three requests of 7 prompt tokens take 2 blocks each.
    sched, pool = make_scheduler(num_blocks=6, budget=100)
    reqs = [
        make_request("p0-t0", 7, priority=0, arrival=0),
        make_request("p1-t1", 7, priority=1, arrival=1),
        make_request("p0-t2", 7, priority=0, arrival=2),
    ]
    for r in reqs:
        sched.add_request(r)
    run_step(sched)  # all prefilled: 8 tokens each now (7 + 1 sampled), 2 blocks each
    assert pool.num_free_blocks == 0
    run_step(sched)  # the 8th token still fits the second block
    assert pool.num_free_blocks == 0
    out = run_step(sched)  # each needs a third block: the worst (priority 1) is preempted
    assert [r.request_id for r in out.preempted] == ["p1-t1"]
    assert ids(out) == [("p0-t0", 1), ("p0-t2", 1)]
    victim = reqs[1]
    assert victim.status == RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
    assert victim.blocks == [] and victim.output_token_ids == [7, 7]
    assert sched.num_preemptions_total == 1
    # The freed blocks went to the two survivors; the victim waits.
    assert [r.request_id for r in sched.waiting] == ["p1-t1"]


def test_high_priority_arrival_preempts_running_bulk_request():
    sched, _ = make_scheduler(num_blocks=4, budget=100)
    bulk = make_request("bulk", 12, priority=1, arrival=0)
    sched.add_request(bulk)
    run_step(sched)  # 13 tokens: 4 blocks, the whole cache
    urgent = make_request("urgent", 5, priority=0, arrival=1)
    sched.add_request(urgent)
    out = run_step(sched)
    assert [r.request_id for r in out.preempted] == ["bulk"]
    assert ids(out) == [("urgent", 5)]  # bulk's decode was refunded to the budget


def test_prefix_hits_are_counted_and_skip_computation():
    sched, pool = make_scheduler(num_blocks=16, budget=100)
    first = make_request("first", 9, base=100)
    sched.add_request(first)
    run_step(sched)
    second = make_request("second", 9, base=100)
    sched.add_request(second)
    out = run_step(sched)
    # 2 full blocks (8 tokens) of the shared prompt are cached; only 1 token computed.
    assert ("second", 1) in ids(out)
    assert second.num_cached_tokens == 8
    assert second.block_ids[:2] == first.block_ids[:2]


def test_no_caching_means_no_hits():
    sched, _ = make_scheduler(num_blocks=16, budget=100, caching=False)
    sched.add_request(make_request("first", 9, base=100))
    run_step(sched)
    second = make_request("second", 9, base=100)
    sched.add_request(second)
    assert ("second", 9) in ids(run_step(sched))
