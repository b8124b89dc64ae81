"""A local stand-in for the Hugging Face Hub's HTTP API, enough for ``huggingface_hub``'s real client:
create_repo, upload_folder (regular and LFS files, one commit), repo_info, hf_hub_download and
snapshot_download, whoami; and, for dataset repositories added with ``add_dataset``, what ``datasets``
needs to resolve and stream one (repository info, tree listing, paths-info, file downloads with byte
ranges). Point the clients at it with ``HF_ENDPOINT`` (and ``HF_HUB_DISABLE_XET=1``).

``fail_next`` makes chosen endpoints answer with an error status, to test retries and failed commits.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

from http_stand_in import serving_thread

LFS_THRESHOLD = 1 << 20


@dataclass
class Repo:
    private: bool
    commits: list[dict] = field(default_factory=list)  # each: {"oid", "message", "files": {path: oid}}
    # a gated repository ("auto" or "manual"): its metadata public, its files for a token that was granted them
    gated: str | bool = False

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
        self.datasets: dict[str, Repo] = {}
        self.bytes_sent: dict[str, int] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = serving_thread(self._server)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def file(self, repo_id: str, path: str) -> bytes:
        return self.blobs[self.repos[repo_id].files[path]]

    def add_dataset(self, repo_id: str, files: dict[str, bytes], private: bool = False) -> None:
        """A dataset repository holding ``files`` in one commit, stored as the Hub stores them (LFS for
        parquet files)."""
        stored = {}
        for path, data in files.items():
            oid = hashlib.sha256(data).hexdigest() if path.endswith(".parquet") else git_blob_oid(data)
            self.blobs[oid] = data
            stored[path] = oid
        commit = hashlib.sha1(json.dumps(sorted(stored.items())).encode()).hexdigest()
        self.datasets[repo_id] = Repo(private=private, commits=[{"oid": commit, "message": "add", "files": stored}])

    def read_bytes(self, repo_id: str) -> int:
        """Bytes of ``repo_id``'s files sent so far (what its readers downloaded)."""
        return self.bytes_sent.get(repo_id, 0)

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

            def _repo(self, repo_id: str, write: bool = False, kind: str = "models") -> Repo | None:
                role = self._role()
                repo = (hub.datasets if kind == "datasets" else hub.repos).get(repo_id)
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
                if match := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
                    repo = self._repo(match[1], kind="datasets")
                    if repo is None:
                        return None
                    return self._send(
                        200,
                        {
                            "id": match[1],
                            "sha": repo.commits[-1]["oid"],
                            "private": repo.private,
                            "lastModified": "2026-11-30T00:00:00.000Z",
                            "siblings": [{"rfilename": name} for name in sorted(repo.files)],
                        },
                    )
                if match := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
                    repo = self._repo(match[1], kind="datasets")
                    if repo is None:
                        return None
                    recursive = parse_qs(urlparse(self.path).query).get("recursive", ["false"])[0] in ("true", "1")
                    return self._send(200, self._tree(repo, (match[3] or "").strip("/"), recursive))
                if match := re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    return self._download(match[1], match[3], "datasets")
                if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                    repo = self._repo(match[1])
                    if repo is None:
                        return None
                    commit = self._commit(repo, match[2])
                    if commit is None:
                        return None
                    return self._send(
                        200,
                        {
                            "id": match[1],
                            "sha": commit["oid"] if commit else "0" * 40,
                            "private": repo.private,
                            "gated": repo.gated,
                            "siblings": [{"rfilename": name} for name in sorted(commit.get("files", {}))],
                        },
                    )
                if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    return self._download(match[1], match[3], "models", match[2])
                return self._send(404, {"error": f"no route {path}"})

            def _commit(self, repo: Repo, revision: str | None) -> dict | None:
                """The commit a model revision names, as the Hub resolves one: the main branch, or a commit's
                full id; {} for an empty repository's main; None (answered 404) for any other."""
                if revision in (None, "main"):
                    return repo.commits[-1] if repo.commits else {}
                found = [commit for commit in repo.commits if commit["oid"] == revision]
                if not found:
                    self._send(404, {"error": f"Invalid rev id: {revision}"}, {"X-Error-Code": "RevisionNotFound"})
                    return None
                return found[0]

            def _download(self, repo_id: str, file: str, kind: str, revision: str | None = None) -> None:
                repo = self._repo(repo_id, kind=kind)
                if repo is None:
                    return None
                commit = self._commit(repo, revision) if kind == "models" else repo.commits[-1]
                if commit is None:
                    return None
                if repo.gated and self._role() is None:
                    message = f"Access to model {repo_id} is restricted: you must be granted it and authenticated."
                    return self._send(401, {"error": message}, {"X-Error-Code": "GatedRepo"})
                oid = commit.get("files", {}).get(file)
                if oid is None:
                    return self._send(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                data = hub.blobs[oid]
                headers = {"X-Repo-Commit": commit["oid"], "ETag": f'"{oid}"', "Accept-Ranges": "bytes"}
                if len(oid) == 64:  # LFS
                    headers |= {"X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(len(data))}
                status = 200
                if (ranged := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")) and data:
                    start = int(ranged[1])
                    end = min(int(ranged[2]) if ranged[2] else len(data) - 1, len(data) - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    data, status = data[start : end + 1], 206
                if self.command == "GET":
                    hub.bytes_sent[repo_id] = hub.bytes_sent.get(repo_id, 0) + len(data)
                return self._send(status, headers=headers, raw=data)

            def _tree(self, repo: Repo, folder: str, recursive: bool) -> list[dict]:
                """The entries under ``folder`` as the Hub lists them: files, and the folders on the way."""
                entries: dict[str, dict] = {}
                prefix = f"{folder}/" if folder else ""
                for name, oid in sorted(repo.files.items()):
                    if not name.startswith(prefix):
                        continue
                    parts = name[len(prefix) :].split("/")
                    for depth in range(1, len(parts)):
                        if depth > 1 and not recursive:
                            break
                        directory = prefix + "/".join(parts[:depth])
                        entries.setdefault(
                            directory, {"type": "directory", "oid": "0" * 40, "size": 0, "path": directory}
                        )
                    if len(parts) == 1 or recursive:
                        entries[name] = self._file_entry(name, oid)
                return list(entries.values())

            def _file_entry(self, name: str, oid: str) -> dict:
                size = len(hub.blobs[oid])
                entry = {"type": "file", "oid": oid if len(oid) == 40 else git_blob_oid(hub.blobs[oid]), "size": size}
                entry["path"] = name
                if len(oid) == 64:
                    entry["lfs"] = {"oid": oid, "size": size, "pointerSize": 134}
                return entry

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
                if match := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/paths-info/[^/]+", path):
                    body = self._body().decode()
                    repo = self._repo(match[1], kind="datasets")
                    if repo is None:
                        return None
                    if "json" in (self.headers.get("Content-Type") or ""):
                        asked = json.loads(body).get("paths", [])
                    else:
                        asked = parse_qs(body).get("paths", [])
                    found = []
                    for wanted in asked:
                        wanted = wanted.strip("/")
                        if wanted in repo.files:
                            found.append(self._file_entry(wanted, repo.files[wanted]))
                        elif any(name.startswith(wanted + "/") for name in repo.files):
                            found.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": wanted})
                    return self._send(200, found)
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
