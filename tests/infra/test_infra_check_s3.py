"""infra.check_s3 against a real S3 endpoint over HTTP (moto's server mode)."""

from __future__ import annotations

import boto3
import pytest
from moto.server import ThreadedMotoServer

from infra.check_s3 import honours_if_none_match


@pytest.fixture()
def s3_client():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    client.create_bucket(Bucket="tidal-check")
    yield client
    server.stop()


def test_store_with_conditional_writes_passes(s3_client):
    assert honours_if_none_match(s3_client, "tidal-check") is True
    assert s3_client.list_objects_v2(Bucket="tidal-check").get("KeyCount", 0) == 0


def test_store_without_conditional_writes_fails(s3_client):
    # A store that drops the header (as old MinIO did): the second write silently overwrites.
    def drop_if_none_match(params, **_):
        params.pop("IfNoneMatch", None)

    s3_client.meta.events.register("provide-client-params.s3.PutObject", drop_if_none_match)
    assert honours_if_none_match(s3_client, "tidal-check") is False
