"""Routes TensorFlow's own ``gs://`` filesystem to a local Cloud Storage emulator, for the tests.

TensorFlow has the Google endpoints compiled in and reads no emulator variable, but its libcurl honours
``HTTPS_PROXY`` and ``CURL_CA_BUNDLE``. So the tests run a local proxy: it accepts ``CONNECT`` to the
Google storage hosts, terminates TLS with a throw-away certificate made for those names, and forwards each
request to the emulator over plain HTTP. On the way it smooths two things TensorFlow does that the emulator
does not expect: chunked request bodies (it sends them even with a ``Content-Length``) and a
``Transfer-Encoding: identity`` header. Responses that point back at the emulator (the resumable-upload
``Location``) are pointed at the https host again, while the links the emulator stores name the emulator
itself, so that the other clients can follow them. Nothing in the product knows about any of this.

The proxy also stands for the account the README grants: object roles on the bucket, no bucket permissions. It
answers requests for the bucket itself (its metadata, the bucket list), and any request to a bucket the account
has no role on, with Cloud Storage's 403.
"""

from __future__ import annotations

import datetime
import http.client
import http.server
import json
import re
import ssl
import sys
import threading
from pathlib import Path

GOOGLE_STORAGE_HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com")
# a bucket's own resource (metadata, IAM, the bucket list) in the JSON API; its objects are under /o
BUCKET_REQUEST = re.compile(r"/storage/v1/b(?:/([^/]+))?")
SERVICE_ACCOUNT = "trainer@my-project.iam.gserviceaccount.com"
NOT_GRANTED_BUCKET = "not-granted"  # a bucket the account has no role on


def make_certificate(folder: Path, hosts: tuple[str, ...] = GOOGLE_STORAGE_HOSTS) -> tuple[Path, Path]:
    """A self-signed certificate for ``hosts`` and its key, written to ``folder``; the certificate is also
    the CA bundle clients are told to trust."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host) for host in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "gcs-routing.crt", folder / "gcs-routing.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _read_chunked(rfile) -> bytes:  # type: ignore[no-untyped-def]
    body = bytearray()
    while True:
        size = int(rfile.readline().split(b";", 1)[0].strip(), 16)
        if size == 0:
            while rfile.readline().strip():  # trailers, then the blank line
                pass
            return bytes(body)
        body += rfile.read(size)
        rfile.readline()


def _as_multipart_upload(path: str, headers: dict[str, str]) -> tuple[str, dict[str, str], bytes]:
    """The emulator fails on an empty ``uploadType=media`` body (TensorFlow's folder markers); the same empty
    object sent as a multipart upload is stored fine."""
    boundary = "gcs-routing-boundary"
    body = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{{}}\r\n"
        f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--{boundary}--\r\n"
    ).encode()
    headers = {**headers, "Content-Type": f"multipart/related; boundary={boundary}"}
    return path.replace("uploadType=media", "uploadType=multipart"), headers, body


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _RoutingProxy

    def log_message(self, format: str, *args) -> None:  # quiet: the tests read their own output
        pass

    def do_CONNECT(self) -> None:
        host = self.path.split(":", 1)[0]
        if host not in GOOGLE_STORAGE_HOSTS:
            self.send_error(403, f"this test proxy only routes {', '.join(GOOGLE_STORAGE_HOSTS)}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        self.connection = self.server.tls.wrap_socket(self.connection, server_side=True)
        self.rfile = self.connection.makefile("rb")
        self.wfile = self.connection.makefile("wb")
        self.close_connection = False
        while not self.close_connection:
            self.handle_one_request()

    def handle_expect_100(self) -> bool:
        """libcurl asks before a chunked body (TensorFlow's uploads) and waits a second for the answer: it must leave
        the tunnel's buffered writer at once, or every upload costs that second."""
        self.send_response_only(100)
        self.end_headers()
        self.wfile.flush()
        return True

    def _denied_permission(self) -> str:
        """The permission Cloud Storage would deny the README's account (object roles on the test bucket only,
        ``roles/storage.objectUser``): the bucket's own resource (metadata, the bucket list) needs
        ``storage.buckets.*``, and ``NOT_GRANTED_BUCKET`` is a bucket it has no role on; "" where it is allowed."""
        path = self.path.split("?", 1)[0].rstrip("/")
        bucket = BUCKET_REQUEST.fullmatch(path)
        if bucket:
            return "storage.buckets.get" if bucket.group(1) else "storage.buckets.list"
        if f"/b/{NOT_GRANTED_BUCKET}/o" not in path:
            return ""
        if self.command in ("POST", "PUT"):
            return "storage.objects.create"
        if self.command == "DELETE":
            return "storage.objects.delete"
        return "storage.objects.get" if path.split(f"/b/{NOT_GRANTED_BUCKET}/o", 1)[1] else "storage.objects.list"

    def _deny(self) -> bool:
        permission = self._denied_permission()
        if not permission:
            return False
        message = (
            f"{SERVICE_ACCOUNT} does not have {permission} access to the Google Cloud Storage "
            f"{'bucket' if 'buckets' in permission else 'object'}. Permission '{permission}' denied on resource (or "
            "it may not exist)."
        )
        payload = json.dumps(
            {"error": {"code": 403, "message": message, "errors": [{"message": message, "reason": "forbidden"}]}}
        ).encode()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(403, "Forbidden")
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()
        return True

    def _forward(self) -> None:
        if self._deny():
            return
        transfer_encoding = self.headers.get("Transfer-Encoding", "").lower()
        if "chunked" in transfer_encoding:
            body = _read_chunked(self.rfile)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {
            key: value
            for key, value in self.headers.items()
            if key.lower() not in ("transfer-encoding", "content-length", "connection", "proxy-connection")
        }
        path = self.path
        if self.command == "POST" and "uploadType=media" in path and not body:
            path, headers, body = _as_multipart_upload(path, headers)
        headers["Content-Length"] = str(len(body))
        headers["Host"] = f"{self.server.emulator_host}:{self.server.emulator_port}"  # links it stores stay usable
        emulator = http.client.HTTPConnection(self.server.emulator_host, self.server.emulator_port, timeout=60)
        try:
            emulator.request(self.command, path, body=body, headers=headers)
            response = emulator.getresponse()
            payload = response.read()
        finally:
            emulator.close()
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() in ("transfer-encoding", "content-length", "connection", "date", "server"):
                continue
            if key.lower() == "location":
                value = value.replace(self.server.emulator_url, f"https://{self.headers['Host']}", 1)
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward


class _RoutingProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, emulator_url: str, cert: Path, key: Path):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.emulator_url = emulator_url.rstrip("/")
        address = self.emulator_url.split("://", 1)[-1]
        self.emulator_host, port = address.rsplit(":", 1)
        self.emulator_port = int(port)
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert, key)


class GcsRouting:
    """Runs the proxy; ``env`` holds what a process (TensorFlow included) needs to reach the emulator."""

    def __init__(self, emulator_url: str, folder: Path):
        cert, key = make_certificate(folder)
        self._proxy = _RoutingProxy(emulator_url, cert, key)
        self._thread = threading.Thread(target=self._proxy.serve_forever, daemon=True)
        proxy_url = f"http://127.0.0.1:{self._proxy.server_address[1]}"
        self.env = {
            "STORAGE_EMULATOR_HOST": emulator_url,
            "HTTPS_PROXY": proxy_url,
            "https_proxy": proxy_url,
            "CURL_CA_BUNDLE": str(cert),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
            "NO_GCE_CHECK": "true",
        }

    def __enter__(self) -> GcsRouting:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._proxy.shutdown()
        self._proxy.server_close()


def serve(folder: Path, bucket: str) -> None:
    """Runs the emulator (with ``bucket``) and the proxy, prints the environment as one JSON line, then serves
    until killed. The tests run this in a process of its own: TensorFlow holds the GIL in some calls (closing a
    ``GFile`` uploads the file), so a proxy in the test's own process would deadlock with it."""
    from gcp_storage_emulator.server import create_server

    emulator = create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
    emulator.start()
    # port 0: the port is taken as it is bound. A free port found first could be taken by another test process's
    # server before the emulator binds it, and the emulator's start would then wait forever.
    port = emulator._api._httpd.server_address[1]
    with GcsRouting(f"http://127.0.0.1:{port}", folder) as routing:
        print(json.dumps(routing.env), flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2])
