"""Settings shared by the client and the worker, from ``TIDAL_*`` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.queues import DEFAULT_QUEUE_PREFIX


class ProducerSettings(BaseSettings):
    """Where jobs go and where results land.

    ``storage_url`` is ``s3://BUCKET/PREFIX`` (any S3-compatible store; ``s3_endpoint_url``
    points at a non-AWS one) or ``file:///PATH`` / a plain directory path.
    """

    model_config = SettingsConfigDict(env_prefix="TIDAL_", extra="ignore")

    broker_url: str = "redis://localhost:6379/0"
    storage_url: str = "s3://tidal/jobs"
    queue_prefix: str = DEFAULT_QUEUE_PREFIX
    chunk_size: int = Field(default=64, ge=1, description="input lines per chunk task")
    job_ttl_s: int = Field(default=7 * 24 * 3600, ge=60, description="Redis job record lifetime")
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_max_attempts: int = Field(default=5, ge=1, description="boto3 standard retry mode attempts")
    s3_connect_timeout_s: float = Field(default=5.0, gt=0)
    s3_read_timeout_s: float = Field(default=30.0, gt=0)
