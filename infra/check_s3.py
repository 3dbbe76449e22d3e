"""Check that an S3-compatible store honours ``If-None-Match: *`` (first writer wins).

tidal's exactly-one-result guarantee rests on it (DESIGN.md, "Delivery guarantees"): a
redelivered chunk's upload must be refused, not overwrite. Old MinIO releases ignored the header.

Usage: ``python -m infra.check_s3 --bucket tidal [--endpoint-url http://localhost:9000]``
(credentials from the usual AWS_* variables). Exit status 0 when the store refuses the second
write with 412, 1 when it accepted it.
"""

from __future__ import annotations

import argparse
import sys
import uuid

import boto3
from botocore.exceptions import ClientError


def honours_if_none_match(client, bucket: str, prefix: str = "tidal-check") -> bool:
    """Write one key twice with ``IfNoneMatch='*'``; True if the second write got 412.

    Leaves nothing behind: the probe object is deleted either way.
    """
    key = f"{prefix}/{uuid.uuid4().hex}"
    client.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
    except ClientError as error:
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 412:
            raise
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body == b"first"
    finally:
        client.delete_object(Bucket=bucket, Key=key)
    return False


def main(argv: list[str]) -> int:
    """Run the check against the store named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--region", default="us-east-1")
    args = parser.parse_args(argv)
    client = boto3.client("s3", endpoint_url=args.endpoint_url, region_name=args.region)
    if honours_if_none_match(client, args.bucket):
        print(f"ok: {args.endpoint_url or 'AWS S3'} refuses a second If-None-Match: * write (412)")
        return 0
    print(
        f"FAIL: {args.endpoint_url or 'AWS S3'} accepted a second If-None-Match: * write; "
        "redelivered chunks would overwrite results. Upgrade the store."
    )
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
