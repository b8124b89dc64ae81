"""A local stand-in for the Hugging Face Hub's HTTP API, enough for ``huggingface_hub``'s real client:
create_repo, upload_folder (regular and LFS files, one commit), repo_info, hf_hub_download and
snapshot_download, whoami. Point the client at it with ``HF_ENDPOINT`` (and ``HF_HUB_DISABLE_XET=1``).

``fail_next`` makes chosen endpoints answer with an error status, to test retries and failed commits.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LFS_THRESHOLD = 1 << 20


@dataclass
class Repo:
    private: bool
    commits: list[dict] = field(default_factory=list)  # each: {"oid", "message", "files": {path: oid}}

    @property
    def files(self) -> dict[str, str]:
        return self.commits[-1]["files"] if self.commits else {}


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn:
    def __init__(self, tokens: dict[str, str]):
        self.tokens = tokens  # token -> "read" or "write"
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}  # oid -> content (git sha1 for regular files, sha256 for LFS)
        self.fail_next: dict[str, list[int]] = {}  # endpoint name -> statuses to answer, in order
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def file(self, repo_id: str, path: str) -> bytes:
        return self.blobs[self.repos[repo_id].files[path]]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _send(self, status: int, body: object = None, headers: dict | None = None, raw: bytes | None = None):
                data = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _role(self) -> str | None:
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
                return hub.tokens.get(token)

            def _injected(self, endpoint: str) -> bool:
                statuses = hub.fail_next.get(endpoint)
                if statuses:
                    self._body()
                    self._send(statuses.pop(0), {"error": f"injected failure of {endpoint}"})
                    return True
                return False

            def _repo(self, repo_id: str, write: bool = False) -> Repo | None:
                role = self._role()
                repo = hub.repos.get(repo_id)
                if repo is None or (repo.private and role is None):
                    self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                    return None
                if write and role != "write":
                    self._send(403, {"error": "You don't have the rights to write to this repository"})
                    return None
                return repo

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path))
                if path == "/api/whoami-v2":
                    role = self._role()
                    if role is None:
                        return self._send(401, {"error": "Invalid credentials in Authorization header"})
                    return self._send(
                        200,
                        {
                            "name": "user",
                            "type": "user",
                            "auth": {"accessToken": {"displayName": "test", "role": role}},
                        },
                    )
                if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
                    repo = self._repo(match[1])
                    if repo is None:
                        return None
                    sha = repo.commits[-1]["oid"] if repo.commits else "0" * 40
                    return self._send(
                        200,
                        {
                            "id": match[1],
                            "sha": sha,
                            "private": repo.private,
                            "siblings": [{"rfilename": name} for name in sorted(repo.files)],
                        },
                    )
                if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    repo = self._repo(match[1])
                    if repo is None:
                        return None
                    oid = repo.files.get(match[3])
                    if oid is None:
                        return self._send(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                    headers = {"X-Repo-Commit": repo.commits[-1]["oid"], "ETag": f'"{oid}"'}
                    if len(oid) == 64:  # LFS
                        headers |= {"X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(len(hub.blobs[oid]))}
                    return self._send(200, headers=headers, raw=hub.blobs[oid])
                return self._send(404, {"error": f"no route {path}"})

            def do_PUT(self) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(("PUT", path))
                if self._injected("lfs-upload"):
                    return None
                if match := re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", path):
                    data = self._body()
                    if hashlib.sha256(data).hexdigest() != match[1]:
                        return self._send(400, {"error": "sha256 mismatch"})
                    hub.blobs[match[1]] = data
                    return self._send(200, {})
                return self._send(404, {"error": f"no route {path}"})

            def do_POST(self) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(("POST", path))
                if path == "/api/validate-yaml":  # model cards' metadata
                    self._body()
                    return self._send(200, {"errors": [], "warnings": []})
                if path == "/api/repos/create":
                    if self._injected("create"):
                        return None
                    if self._role() != "write":
                        return self._send(401, {"error": "Invalid credentials"})
                    request = json.loads(self._body())
                    repo_id = f"{request.get('organization') or 'user'}/{request['name']}"
                    if repo_id in hub.repos:
                        return self._send(409, {"error": "You already created this model repo", "url": ""})
                    hub.repos[repo_id] = Repo(private=bool(request.get("private")))
                    return self._send(200, {"url": f"{hub.url}/{repo_id}"})
                if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/[^/]+", path):
                    request = json.loads(self._body())
                    repo = self._repo(match[1], write=True)
                    if repo is None:
                        return None
                    files = []
                    for file in request["files"]:
                        lfs = file["size"] > LFS_THRESHOLD or file["path"].endswith((".h5", ".bin", ".safetensors"))
                        files.append(
                            {
                                "path": file["path"],
                                "uploadMode": "lfs" if lfs else "regular",
                                "shouldIgnore": False,
                                "oid": repo.files.get(file["path"]),
                            }
                        )
                    return self._send(200, {"files": files})
                if match := re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path):
                    request = json.loads(self._body())
                    if self._repo(match[1], write=True) is None:
                        return None
                    objects = []
                    for obj in request["objects"]:
                        entry = {"oid": obj["oid"], "size": obj["size"]}
                        if obj["oid"] not in hub.blobs:
                            entry["actions"] = {"upload": {"href": f"{hub.url}/lfs-upload/{obj['oid']}"}}
                        objects.append(entry)
                    return self._send(200, {"transfer": "basic", "objects": objects})
                if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/[^/]+", path):
                    if self._injected("commit"):
                        return None
                    lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
                    repo = self._repo(match[1], write=True)
                    if repo is None:
                        return None
                    files = dict(repo.files)
                    message = ""
                    for line in lines:
                        value = line["value"]
                        if line["key"] == "header":
                            message = value["summary"]
                        elif line["key"] == "file":
                            data = base64.b64decode(value["content"])
                            oid = git_blob_oid(data)
                            hub.blobs[oid] = data
                            files[value["path"]] = oid
                        elif line["key"] == "lfsFile":
                            if value["oid"] not in hub.blobs:
                                return self._send(422, {"error": f"LFS object {value['oid']} was never uploaded"})
                            files[value["path"]] = value["oid"]
                        elif line["key"] == "deletedFile":
                            files.pop(value["path"], None)
                    oid = hashlib.sha1(json.dumps([len(repo.commits), message, files]).encode()).hexdigest()
                    repo.commits.append({"oid": oid, "message": message, "files": files})
                    return self._send(
                        200,
                        {"commitUrl": f"{hub.url}/{match[1]}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None},
                    )
                return self._send(404, {"error": f"no route {path}"})

        return Handler
