"""The worker's consumer survives losing Redis while it waits on a BRPOP.

When Redis goes away, the consumer notices it on whichever socket wakes first. If that is the
pub/sub socket (remote control), the task channel still has a BRPOP outstanding, and kombu's
first close of that channel stops at reading the BRPOP reply; Celery's second close, after
the transport is detached, then raised ``AttributeError`` ("Unrecoverable error"): the worker
stopped consuming and a running job never finished (test_redis_restart_mid_job, now and then).
This drives Celery's real reconnect teardown on exactly that state.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis
from kombu import Consumer, Exchange, Queue

from producer.queues import queue_name
from worker.celery_app import create_app
from worker.settings import WorkerSettings

UNACKED_KEY = "unacked"  # kombu's hash of delivered, not yet acked messages


# Celery warns there that running late-ack tasks are not cancelled on a connection loss.
@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_reconnect_after_redis_loss_with_a_brpop_outstanding(redis_server):
    settings = WorkerSettings(broker_url=redis_server.url, metrics_port=None)
    app, _ = create_app(settings)
    normal = queue_name("normal")
    conn = app.connection_for_read()
    conn.ensure_connection(max_retries=1)
    with app.producer_or_acquire() as producer:
        producer.publish({"n": 1}, exchange=normal, routing_key=normal,
                         declare=[app.amqp.queues[normal]], serializer="json")  # fmt: skip

    # The task channel: one message delivered and not acked, and a BRPOP outstanding.
    channel = conn.default_channel
    channel.basic_qos(0, 2, False)
    delivered = []
    consumer = Consumer(channel, [app.amqp.queues[normal]], accept=["json"],
                        callbacks=[lambda body, message: delivered.append(message)])  # fmt: skip
    consumer.consume()
    conn.drain_events(timeout=5)
    try:
        conn.drain_events(timeout=0.05)
    except TimeoutError:
        pass
    assert len(delivered) == 1 and channel._in_poll, "not the state under test"
    # A second channel like the remote-control one: an auto-delete fanout queue (its close
    # fails while Redis is away, which stops kombu closing the other channels).
    control = conn.channel()
    fanout = Queue("ctl", Exchange("ctl", type="fanout"), auto_delete=True)
    Consumer(control, [fanout], accept=["json"], callbacks=[lambda b, m: None]).consume()

    redis_server.stop()
    worker_consumer = object.__new__(app.conf.worker_consumer)
    worker_consumer.app = app
    worker_consumer.connection = conn
    worker_consumer.qos_global = False
    worker_consumer.pool = SimpleNamespace(num_processes=2)
    worker_consumer.prefetch_multiplier = 1
    worker_consumer.initial_prefetch_count = 2
    # Raised AttributeError ('NoneType' object has no attribute 'hostname') before the fix.
    worker_consumer.on_connection_error_after_connected(redis.ConnectionError("lost"))
    assert worker_consumer.connection is None and channel.closed

    # Nothing lost: the delivered message is still in Redis for the visibility timeout.
    redis_server.start()
    assert redis.Redis.from_url(redis_server.url).hlen(UNACKED_KEY) == 1


def test_unacked_mutex_expires_within_the_visibility_timeout(redis_server):
    # A restore scan cut short by a Redis restart leaves kombu's lock behind (it is persisted
    # with the data, and nothing can release it): restores then wait for it to expire, which
    # was kombu's 300 s even with a visibility timeout of seconds.
    for visibility_timeout_s, expected in ((6, 6), (4 * 3600, 300)):
        settings = WorkerSettings(broker_url=redis_server.url, metrics_port=None,
                                  visibility_timeout_s=visibility_timeout_s)  # fmt: skip
        app, _ = create_app(settings)
        with app.connection_for_read() as conn:
            assert conn.default_channel.unacked_mutex_expire == expected
