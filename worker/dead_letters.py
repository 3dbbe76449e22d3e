"""Dead letters: messages that cannot be decoded and chunks that can never succeed.

Each record goes to a Redis list (``{prefix}.dead_letters``, newest first) and, when a store
is reachable, to ``dead_letters/<id>.json`` under the storage root, for a person to look at.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from producer.queues import dead_letter_key

logger = logging.getLogger(__name__)

MAX_BODY_CHARS = 100_000


def dead_letter(
    redis_client: Any,
    prefix: str,
    reason: str,
    detail: str,
    body: Any = None,
    task_id: str | None = None,
    storage: Any = None,
) -> dict[str, Any]:
    """Record a dead letter; never raises (a failure to record is logged)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and len(body) > MAX_BODY_CHARS:
        body = body[:MAX_BODY_CHARS] + "...(truncated)"
    record = {
        "id": task_id or uuid.uuid4().hex,
        "reason": reason,
        "detail": detail,
        "body": body,
        "at": time.time(),
    }
    data = json.dumps(record, default=str)
    logger.error("dead letter %s (%s): %s", record["id"], reason, detail)
    try:
        redis_client.lpush(dead_letter_key(prefix), data)
    except Exception as exc:
        logger.error("could not record dead letter %s in Redis: %s", record["id"], exc)
    if storage is not None:
        try:
            storage.put(f"dead_letters/{record['id']}.json", data.encode())
        except Exception as exc:
            logger.error("could not store dead letter %s: %s", record["id"], exc)
    return record
