"""The producer side of tidal: job schemas, the client library and the ``tidal`` CLI (no torch)."""

from producer.client import Client, JobHandle

__all__ = ["Client", "JobHandle"]
