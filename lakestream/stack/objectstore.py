"""A local S3-compatible object store: Versity's S3 gateway (versitygw) on its POSIX backend, under the state dir.

versitygw is a production S3 server (Apache-2.0, Go) that maps buckets to directories and objects to files,
so the warehouse survives a restart of the store (an outage the engine waits out loses nothing). It checks SigV4
signatures (wrong credentials fail as on S3) and serves what Iceberg's S3FileIO, pyarrow, DuckDB and Trino send:
path-style requests, multipart uploads, suffix ranges (``Range: bytes=-N``) and conditional writes. Its object
metadata (ETags, content types) goes to a sidecar directory beside the buckets, so it runs on any file system,
with or without extended attributes.

The binary is built from Versity's Go module at a pinned version (`lakestream.stack.gateway`); a stack that finds it
missing builds it on first use.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lakestream.errors import StackError
from lakestream.stack import process
from lakestream.stack.models import ACCESS_KEY_ENV, SECRET_KEY_ENV, StackSettings  # noqa: F401

log = logging.getLogger(__name__)

# The environment variables a local-stack pipeline config names for the store's credentials
# (`storage.access_key_id_env` / `secret_access_key_env`): the file never holds them.


class ObjectStore(process.PidService):
    """versitygw on 127.0.0.1:<s3_port> with one bucket (``s3_bucket``), tracked by a pid file."""

    name = "objectstore"
    persistent = True
    start_timeout = 30.0

    def __init__(self, settings: StackSettings):
        self.settings = settings
        root = settings.state_dir / "objectstore"
        self.data_dir = root / "buckets"  # one directory per bucket, one file per object
        self.meta_dir = root / "meta"  # the gateway's sidecar metadata, outside the bucket tree
        self.log_path = settings.state_dir / "logs" / f"{self.name}.log"
        self.pid_file = process.PidFile(settings.state_dir / "pids" / f"{self.name}.pid", "versitygw")

    @property
    def port(self) -> int:
        return self.settings.s3_port

    @property
    def endpoint(self) -> str:
        return f"http://{process.LOOPBACK}:{self.port}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.settings.s3_bucket}/warehouse"

    def object_path(self, bucket: str, key: str) -> Path:
        """The file that holds object ``key`` of ``bucket`` (the POSIX backend's layout)."""
        return self.data_dir / bucket / key

    def check_port_free(self) -> None:
        process.require_free_port(self.port, "object store", "--s3-port / StackSettings.s3_port")

    def start(self) -> None:
        """Start the gateway unless it runs, wait until it answers, and create the bucket (idempotent)."""
        if self.pid() is None:
            self.check_port_free()
            # Imported here: `python -m lakestream.stack.gateway` must not find its module imported by the package.
            from lakestream.stack.gateway import build_gateway

            binary = build_gateway()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.meta_dir.mkdir(parents=True, exist_ok=True)
            # Credentials through the environment, not argv: /proc/<pid>/cmdline is world-readable.
            env = {
                **os.environ,
                "ROOT_ACCESS_KEY_ID": self.settings.s3_access_key,
                "ROOT_SECRET_ACCESS_KEY": self.settings.s3_secret_key,
                "VGW_REGION": self.settings.s3_region,
                "VGW_PORT": f"{process.LOOPBACK}:{self.port}",
                # Keep-alive is off by default in versitygw: every request would open a connection.
                "VGW_KEEP_ALIVE": "true",
                "VGW_QUIET": "true",  # no line per request
                "VGW_META_SIDECAR": str(self.meta_dir),
            }
            argv = [str(binary), "posix", str(self.data_dir)]
            log.info("starting %s on %s", self.name, self.endpoint)
            pid = process.spawn_detached(argv, self.log_path, cwd=self.settings.state_dir, env=env)
            self.pid_file.write(pid)
            process.wait_until(
                lambda: not process.pid_alive(pid) or process.port_accepts(self.port), self.start_timeout
            )
            if not process.pid_alive(pid) or not process.port_accepts(self.port):
                self.stop(timeout=5)
                raise StackError(
                    f"{self.name} (versitygw) on {self.endpoint} did not start\n"
                    f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
                )
        if not process.wait_until(self.healthy, 15.0, 0.2):
            tail = process.log_tail(self.log_path)
            self.stop(timeout=5)  # not left running behind a start that failed
            raise StackError(
                f"{self.name} on {self.endpoint} does not answer S3 requests\n--- {self.log_path} ---\n{tail}"
            )
        self.create_bucket()

    def client(self):
        """A boto3 S3 client with the store's credentials."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.settings.s3_region,
            aws_access_key_id=self.settings.s3_access_key,
            aws_secret_access_key=self.settings.s3_secret_key,
            config=Config(
                connect_timeout=2,
                read_timeout=10,
                retries={"max_attempts": 1},
                s3={"addressing_style": "path"},
                signature_version="s3v4",  # also for presigned URLs, which boto3 signs with SigV2 by default
            ),
        )

    def create_bucket(self) -> None:
        client = self.client()
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if self.settings.s3_bucket not in existing:
            client.create_bucket(Bucket=self.settings.s3_bucket)

    def healthy(self) -> bool:
        try:
            self.client().list_buckets()
            return True
        except Exception:  # noqa: BLE001 — any failure means "not answering yet"
            return False

    @property
    def detail(self) -> str:
        return f"versitygw, objects on disk ({self.data_dir}), bucket {self.settings.s3_bucket}"
