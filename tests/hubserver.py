"""A loopback imitation of the Hugging Face hub's file-download API, for huggingface_hub in tests.

Serves, on 127.0.0.1 only:
    HEAD/GET /{repo_id}/resolve/{revision}/{filename}
        small files: 200 with ETag = git blob SHA-1, X-Repo-Commit, Content-Length;
        large (LFS) files: 302 to /lfs/{repo_id}/{sha256} with X-Linked-Etag = SHA-256, X-Linked-Size, X-Repo-Commit
        (as the hub redirects to its CDN; here http://localhost:PORT, the same loopback server); unknown repo / revision / file: 404 with X-Error-Code.
    GET /lfs/{repo_id}/{sha256}    the content, with Range support (206 + Content-Range).
Faults, per (repo, filename): `corrupt` serves other bytes under the original hashes; `drop_after` sends
the headers of the whole file, then n bytes, then closes the connection (once). `throttle` slows every
content transfer (seconds per MiB).
Every request is logged as (method, path, Range header).
"""
from __future__ import annotations

import hashlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_MIN = 1 << 20                  # files from 1 MiB up are "LFS" (model.safetensors)


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], commits: dict[str, str] | None = None):
        self.repos = repos
        self.commits = {r: (commits or {}).get(r) or hashlib.sha1(r.encode()).hexdigest() for r in repos}
        self.corrupt: dict[tuple[str, str], bytes] = {}
        self.drop_after: dict[tuple[str, str], int] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.throttle = 0.0                                   # seconds per MiB sent of file content
        self._lfs: dict[tuple[str, str], str] = {}          # (repo, sha256) -> filename
        for r, files in repos.items():
            for name, data in files.items():
                if len(data) >= LFS_MIN:
                    self._lfs[r, hashlib.sha256(data).hexdigest()] = name
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # the "CDN" answers on the same loopback server under another host name, so that huggingface_hub
        # treats the redirect as leaving the hub (it follows same-host redirects, not others)
        self.cdn = f"http://localhost:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @classmethod
    def from_dir(cls, repo: str, d: Path, files=("model.safetensors", "vocab.json", "merges.txt", "config.json"),
                 commit: str | None = None) -> "FakeHub":
        return cls({repo: {f: (Path(d) / f).read_bytes() for f in files}}, {repo: commit} if commit else None)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def gets(self, suffix: str = "") -> list:
        return [e for e in self.log if e[0] == "GET" and e[1].endswith(suffix)]

    def _handler(self):
        hub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):                 # quiet
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _send(self, code, headers=None, body=b"", head=False):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                if "Content-Length" not in (headers or {}):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head and body:
                    self.wfile.write(body)

            def _serve(self, head: bool):
                path = self.path.split("?", 1)[0]
                hub.log.append((self.command, path, self.headers.get("Range")))
                if path.startswith("/lfs/"):
                    repo, _, sha = path[len("/lfs/"):].rpartition("/")
                    if (repo, sha) not in hub._lfs:
                        return self._send(404, {"X-Error-Code": "EntryNotFound"}, head=head)
                    name = hub._lfs[repo, sha]
                    return self._content(repo, name, hub.repos[repo][name], head, {"ETag": f'"{sha}"'})
                if "/resolve/" not in path:
                    return self._send(404, {"X-Error-Code": "RepoNotFound"}, head=head)
                repo, rest = path[1:].split("/resolve/", 1)
                if repo not in hub.repos:
                    return self._send(401, {"X-Error-Code": "RepoNotFound"}, b"Repository not found", head)
                revision, _, name = rest.partition("/")
                commit = hub.commits[repo]
                if revision not in ("main", commit):
                    return self._send(404, {"X-Error-Code": "RevisionNotFound", "X-Repo-Commit": commit}, head=head)
                files = hub.repos[repo]
                if name not in files:
                    return self._send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, head=head)
                data = files[name]
                if len(data) >= LFS_MIN:
                    sha = hashlib.sha256(data).hexdigest()
                    return self._send(302, {"Location": f"{hub.cdn}/lfs/{repo}/{sha}", "X-Repo-Commit": commit,
                                            "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                                            "ETag": f'"{git_sha1(data)}"'}, head=head)
                return self._content(repo, name, data, head, {"ETag": f'"{git_sha1(data)}"', "X-Repo-Commit": commit})

            def _content(self, repo, name, data, head, headers):
                key = (repo, name)
                body = hub.corrupt.get(key, data)
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and not head:
                    start = int(rng[len("bytes="):].split("-", 1)[0])
                h = dict(headers, **{"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"})
                if start:
                    h["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
                    h["Content-Length"] = str(len(body) - start)
                    code = 206
                else:
                    h["Content-Length"] = str(len(body))
                    code = 200
                if head:
                    return self._send(code, h, head=True)
                cut = hub.drop_after.pop(key, None)
                if cut is not None:
                    self.send_response(code)
                    for k, v in h.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body[start:start + cut])
                    self.wfile.flush()
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.send_response(code)
                for k, v in h.items():
                    self.send_header(k, v)
                self.end_headers()
                view = memoryview(body)[start:]
                for i in range(0, len(view), 1 << 20):
                    self.wfile.write(view[i:i + (1 << 20)])
                    if hub.throttle:
                        time.sleep(hub.throttle)

        return H
