"""Job objects in S3 (or a local directory): first-writer-wins puts at deterministic keys.

``put(key, data, if_absent=True)`` is a conditional put (``If-None-Match: *``): it returns
False, writing nothing, when the key already exists, so a redelivered chunk can never make a
second object. Errors are split by what the caller should do: ``PermanentStorageError``
(missing bucket, access denied: fail fast, never retry) and ``TransientStorageError`` (5xx,
throttling, connection trouble left after boto3's own ``standard`` retries: retry later).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from producer.settings import ProducerSettings

_PERMANENT_CODES = {
    "NoSuchBucket", "AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId",
    "SignatureDoesNotMatch", "AccountProblem", "InvalidBucketName", "404",
}  # fmt: skip


class StorageError(RuntimeError):
    """A storage operation failed."""


class PermanentStorageError(StorageError):
    """Retrying will not help (bucket missing, access denied, bad credentials)."""


class TransientStorageError(StorageError):
    """The store was unavailable or throttling after all retries; try again later."""


class Storage(Protocol):
    """Objects under one job root; keys are relative (``JOB_ID/results/part-00000.jsonl``)."""

    url: str

    def check(self) -> None: ...
    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool: ...
    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes | None: ...
    def exists(self, key: str) -> bool: ...


def open_storage(settings: ProducerSettings, url: str | None = None) -> Storage:
    """The store at ``url`` (default ``settings.storage_url``): ``s3://`` or a local path."""
    url = url or settings.storage_url
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if len(parsed.netloc) < 3:
            raise ValueError(f"storage url {url!r} needs a bucket name of 3+ characters")
        return S3Storage(url, parsed.netloc, parsed.path.strip("/"), settings)
    if parsed.scheme in ("", "file"):
        return LocalStorage(url, Path(parsed.path if parsed.scheme else url))
    raise ValueError(f"storage url {url!r}: scheme must be s3:// or file:// (or a plain path)")


class LocalStorage:
    """A directory; conditional puts are atomic hard links (first link wins)."""

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PermanentStorageError(f"cannot use directory {self.root}: {exc}") from None
        if not os.access(self.root, os.W_OK):
            raise PermanentStorageError(f"directory {self.root} is not writable")

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if not if_absent:
                os.replace(tmp, path)
                return True
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes | None:
        try:
            with open(self.root / key, "rb") as f:
                if byte_range is None:
                    return f.read()
                f.seek(byte_range[0])
                return f.read(byte_range[1] - byte_range[0])
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        return (self.root / key).is_file()


class S3Storage:
    """An S3 bucket and prefix, through boto3 with the ``standard`` retry mode."""

    def __init__(self, url: str, bucket: str, prefix: str, settings: ProducerSettings) -> None:
        import boto3
        from botocore.config import Config

        self.url = url
        self.bucket = bucket
        self.prefix = prefix
        config = Config(
            retries={"mode": "standard", "max_attempts": settings.s3_max_attempts},
            connect_timeout=settings.s3_connect_timeout_s,
            read_timeout=settings.s3_read_timeout_s,
        )
        self.client = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            config=config,
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def check(self) -> None:
        """Fails fast (``PermanentStorageError``) when the bucket is missing or forbidden."""
        with _translated(f"s3://{self.bucket}"):
            self.client.head_bucket(Bucket=self.bucket)

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        for attempt in range(5):
            try:
                with _translated(f"s3://{self.bucket}/{self._key(key)}"):
                    self.client.put_object(
                        Bucket=self.bucket, Key=self._key(key), Body=data, **extra
                    )
                return True
            except _Conditional as exc:
                if exc.status == 412:
                    return False
                time.sleep(0.1 * 2**attempt)  # 409: a concurrent conditional write; retry
        raise TransientStorageError(f"s3://{self.bucket}/{self._key(key)}: 409 conflicts persist")

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes | None:
        extra = {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"} if byte_range else {}
        try:
            with _translated(f"s3://{self.bucket}/{self._key(key)}"):
                return self.client.get_object(Bucket=self.bucket, Key=self._key(key), **extra)[
                    "Body"
                ].read()
        except _Missing:
            return None

    def exists(self, key: str) -> bool:
        try:
            with _translated(f"s3://{self.bucket}/{self._key(key)}"):
                self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except _Missing:
            return False


class _Missing(Exception):
    """The object (not the bucket) does not exist."""


class _Conditional(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class _translated:
    """Maps botocore errors to the storage errors above."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            return
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (412, 409):
                raise _Conditional(412 if code == "PreconditionFailed" or status == 412 else 409)
            if code in ("NoSuchKey", "404", "NotFound") and "/" in self.what[5:]:
                raise _Missing() from None
            if code in _PERMANENT_CODES or status in (401, 403, 404):
                raise PermanentStorageError(
                    f"{self.what}: {code or status} {error.get('Message', '')}".strip()
                    + " (check that the bucket exists and the credentials may write to it)"
                ) from None
            raise TransientStorageError(f"{self.what}: {code or status} after retries") from None
        if isinstance(exc, BotoCoreError):
            raise TransientStorageError(f"{self.what}: {exc}") from None
