"""The lost-chunk sweep (worker/recovery.py) against a real Redis and moto S3, no worker."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from producer.queues import job_chunks_key
from tests.worker.jobcheck import make_client, submit
from worker.metrics import WorkerMetrics
from worker.recovery import KOMBU_UNACKED_KEY, LostChunkSweeper, chunk_of


def test_sweep_resends_only_chunks_nobody_holds_as_the_producer_sent_them(
    redis_server, s3_endpoint, tmp_path
):
    client = make_client(redis_server.url, s3_endpoint, chunk_size=8)
    handle, _ = submit(client, tmp_path, num_lines=37, max_tokens=4)  # 5 chunks, last short
    r = client.redis
    raws = r.lrange("tidal.normal", 0, -1)
    sent = {chunk_of(raw)[1]: json.loads(raw) for raw in raws}
    assert sorted(sent) == [0, 1, 2, 3, 4]
    r.delete("tidal.normal")
    # chunk 0 is done, chunk 1 delivered to a live worker, chunk 2 still queued; 3 and 4 lost
    r.sadd(job_chunks_key(handle.job_id), 0)
    r.hset(KOMBU_UNACKED_KEY, "tag-1", json.dumps([sent[1], "tidal.normal", "tidal.normal"]))
    r.lpush("tidal.normal", json.dumps(sent[2]))

    resent = []
    rt = SimpleNamespace(
        redis=r,
        settings=SimpleNamespace(queue_prefix="tidal"),
        storage=client.storage,
        metrics=WorkerMetrics(),
    )
    sweeper, other_worker = (
        LostChunkSweeper(rt, lambda name, **kw: resent.append((name, kw)), 0.01) for _ in "ab"
    )
    time.sleep(0.05)  # older than two intervals: the producer has sent all its chunks
    assert sweeper.sweep() == []  # missing once: could be a BRPOP reply on its way
    assert other_worker.sweep() == []  # the lock: one sweep per interval
    time.sleep(0.02)  # the sweep lock expires; any worker confirms the last sweep's suspects
    assert other_worker.sweep() == [(handle.job_id, 3), (handle.job_id, 4)]
    assert [name for name, _ in resent] == ["tidal.run_chunk"] * 2
    assert all(kw["queue"] == "tidal.normal" for _, kw in resent)
    for (_, kw), index in zip(resent, (3, 4), strict=True):
        _args, original, _embed = json.loads(_body(sent[index]))
        assert kw["kwargs"] == original
    assert rt.metrics.chunks_resent._value.get() == 2

    # Once done or held again, nothing more is sent; a finished job is not looked at.
    time.sleep(0.02)
    r.sadd(job_chunks_key(handle.job_id), 3, 4)
    assert sweeper.sweep() == [] and len(resent) == 2
    r.hset(f"tidal.job.{handle.job_id}", "state", "completed")
    r.delete(KOMBU_UNACKED_KEY, "tidal.normal")
    for _ in range(2):
        time.sleep(0.02)
        assert sweeper.sweep() == []


def _body(message: dict) -> bytes:
    import base64

    body = message["body"]
    return base64.b64decode(body) if message["properties"]["body_encoding"] == "base64" else body
