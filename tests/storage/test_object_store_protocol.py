"""The stack's object store speaks the S3 that Lakestream's clients send: SigV4 (a wrong secret is refused),
path-style addressing, suffix ranges (``Range: bytes=-N``, which Trino's native S3 file system and Parquet
readers send for a file's tail), multipart uploads, conditional writes (``If-None-Match: *``), and objects that
outlive a restart of the store. boto3 and pyarrow against the suite's store (Versity's S3 gateway)."""

from __future__ import annotations

import os
import uuid

import pytest
from botocore.exceptions import ClientError


@pytest.fixture
def s3(object_store):
    return object_store.client()


def _key(name: str) -> str:
    return f"protocol/{uuid.uuid4().hex}/{name}"


def test_suffix_and_bounded_ranges(object_store, s3):
    bucket, key = object_store.settings.s3_bucket, _key("tail.bin")
    body = bytes(range(256)) * 40  # 10,240 bytes
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    tail = s3.get_object(Bucket=bucket, Key=key, Range="bytes=-4750")
    assert tail["Body"].read() == body[-4750:]
    assert tail["ContentRange"] == f"bytes {len(body) - 4750}-{len(body) - 1}/{len(body)}"
    assert s3.get_object(Bucket=bucket, Key=key, Range="bytes=100-199")["Body"].read() == body[100:200]
    assert s3.get_object(Bucket=bucket, Key=key, Range="bytes=10000-")["Body"].read() == body[10000:]
    # A suffix longer than the object is the whole object (RFC 9110), as on S3.
    assert s3.get_object(Bucket=bucket, Key=key, Range="bytes=-999999")["Body"].read() == body


def test_path_style_requests_and_presigned_sigv4_only(object_store, s3):
    """The client is configured path-style (``http://host:port/<bucket>/<key>``): the bucket is in the path. A
    presigned GET signed with SigV4 reads the object; one signed with SigV2 is refused, as on S3."""
    import urllib.error
    import urllib.request

    import boto3
    from botocore.config import Config

    bucket, key = object_store.settings.s3_bucket, _key("path-style.txt")
    s3.put_object(Bucket=bucket, Key=key, Body=b"path")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60)
    assert url.startswith(f"{object_store.endpoint}/{bucket}/{key}?") and "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == b"path"
    s = object_store.settings
    sigv2 = boto3.client(
        "s3",
        endpoint_url=object_store.endpoint,
        region_name=s.s3_region,
        aws_access_key_id=s.s3_access_key,
        aws_secret_access_key=s.s3_secret_key,
        config=Config(signature_version="s3", s3={"addressing_style": "path"}),
    )
    old = sigv2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(old, timeout=10)
    assert refused.value.code == 400 and b"AWS4-HMAC-SHA256" in refused.value.read()


def test_a_wrong_secret_is_refused(object_store):
    import boto3
    from botocore.config import Config

    s = object_store.settings
    wrong = boto3.client(
        "s3",
        endpoint_url=object_store.endpoint,
        region_name=s.s3_region,
        aws_access_key_id=s.s3_access_key,
        aws_secret_access_key=s.s3_secret_key + "-wrong",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )
    with pytest.raises(ClientError) as refused:
        wrong.list_objects_v2(Bucket=s.s3_bucket)
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_multipart_upload_and_conditional_write(object_store, s3):
    bucket, key = object_store.settings.s3_bucket, _key("multipart.bin")
    parts = [os.urandom(5 * 1024 * 1024), os.urandom(5 * 1024 * 1024), os.urandom(1024)]
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=part)["ETag"]
        for n, part in enumerate(parts, start=1)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, start=1)]},
    )
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"".join(parts)
    # A conditional create (what a commit that must not overwrite sends) is refused once the key exists.
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key=key, Body=b"other", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    fresh = _key("conditional.txt")
    s3.put_object(Bucket=bucket, Key=fresh, Body=b"first", IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key=fresh)["Body"].read() == b"first"


def test_pyarrow_reads_a_parquet_tail_and_objects_survive_a_restart(object_store):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakestream.storage import S3Options, filesystem_path

    s = object_store.settings
    options = S3Options(
        endpoint=object_store.endpoint,
        region=s.s3_region,
        path_style=True,
        access_key=s.s3_access_key,
        secret_key=s.s3_secret_key,
    )
    fs, path = filesystem_path(f"s3://{s.s3_bucket}/{_key('rows.parquet')}", options)
    table = pa.table({"id": list(range(10_000)), "v": [f"row-{i}" for i in range(10_000)]})
    with fs.open_output_stream(path) as out:
        pq.write_table(table, out)
    object_store.stop()
    object_store.start()  # the same port, the same directory
    assert pq.read_table(path, filesystem=fs).equals(table)
