"""`kvreport upload` against a real HTTP server on loopback that misbehaves on purpose."""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from kvreport import upload as upload_mod
from kvreport.cli import main
from kvreport.errors import UploadError
from tests.helpers import minimal_bundle


class _Server:
    """Answers POST /api/v1/bundles with the scripted (status, body) pairs, then 201."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                outer.requests.append({"path": self.path, "headers": dict(self.headers),
                                       "bundle": json.loads(body)})
                status, answer = outer.script.pop(0) if outer.script else (201, None)
                if answer is None:
                    answer = {"id": outer.requests[-1]["bundle"]["id"], "url": "http://x/bundles/1",
                              "cluster": {"id": 3, "key": "llama.cpp/kv_cache/cuda",
                                          "title": "llama.cpp · KV cache · CUDA", "count": 2,
                                          "known_fix": "Use -c 8192", "issue_url": "https://github.com/o/r/issues/1"},
                              "diagnosis": {}}
                data = json.dumps(answer).encode() if not isinstance(answer, bytes) else answer
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory(monkeypatch, tmp_path):
    monkeypatch.setattr(upload_mod, "RETRY_BACKOFF", 0.01)
    monkeypatch.setenv("KVREPORT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVREPORT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("KVREPORT_SERVER", raising=False)
    monkeypatch.delenv("KVREPORT_TOKEN", raising=False)
    servers = []

    def make(script=()):
        s = _Server(script)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_upload_retries_5xx_then_succeeds(server_factory):
    srv = server_factory([(503, {"error": {"code": "busy", "message": "busy"}}), (502, b"bad gateway")])
    bundle = minimal_bundle("x")
    answer = upload_mod.upload_bundle(bundle, srv.url, "tok")
    assert answer["status"] == 201
    assert len(srv.requests) == 3
    assert {r["bundle"]["id"] for r in srv.requests} == {bundle["id"]}
    assert srv.requests[0]["headers"]["Authorization"] == "Bearer tok"
    assert srv.requests[0]["path"] == "/api/v1/bundles"


def test_upload_4xx_quotes_the_servers_message_and_does_not_retry(server_factory):
    srv = server_factory([(401, {"error": {"code": "unauthorized", "message": "invalid token"}})])
    with pytest.raises(UploadError, match="HTTP 401.*invalid token"):
        upload_mod.upload_bundle(minimal_bundle(), srv.url, "bad")
    assert len(srv.requests) == 1


def test_unreachable_server_is_one_line_and_keeps_the_bundle(server_factory, tmp_path):
    srv = server_factory()
    url = srv.url
    srv.close()
    path = tmp_path / "b.json"
    path.write_text(json.dumps(minimal_bundle("x")))
    before = path.read_bytes()
    result = CliRunner().invoke(main, ["upload", str(path), "--server", url, "--token", "t"])
    assert result.exit_code == 2
    assert "could not reach" in result.stderr and f"kvreport upload {path}" in result.stderr
    assert "Traceback" not in result.output
    assert path.read_bytes() == before


def test_cli_upload_prints_cluster_known_fix_and_issue(server_factory, tmp_path):
    srv = server_factory()
    path = tmp_path / "b.json"
    bundle = minimal_bundle("x")
    path.write_text(json.dumps(bundle))
    result = CliRunner().invoke(main, ["upload", str(path), "--server", srv.url + "/", "--token", "t"])
    assert result.exit_code == 0, result.output
    assert "http://x/bundles/1" in result.stdout
    assert "(2 reports)" in result.stdout
    assert "Use -c 8192" in result.stdout
    assert "https://github.com/o/r/issues/1" in result.stdout
    from kvreport.config import uploaded_url
    assert uploaded_url(bundle["id"]) == "http://x/bundles/1"


def test_server_and_token_from_config_file(server_factory, tmp_path):
    srv = server_factory()
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "config.ini").write_text(f"[server]\nurl = {srv.url}\ntoken = from-file\n")
    upload_mod.upload_bundle(minimal_bundle(), None, None)
    assert srv.requests[0]["headers"]["Authorization"] == "Bearer from-file"


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON"),
    ('{"schema": "kvreport/bundle@9"}', "schema"),
    ("[1, 2]", "JSON object"),
])
def test_bad_bundle_files_are_refused_before_any_request(server_factory, tmp_path, content, message):
    srv = server_factory()
    path = tmp_path / "b.json"
    path.write_text(content)
    result = CliRunner().invoke(main, ["upload", str(path), "--server", srv.url, "--token", "t"])
    assert result.exit_code == 2
    assert message in result.stderr
    assert srv.requests == []


def test_no_server_configured(server_factory, tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(minimal_bundle()))
    result = CliRunner().invoke(main, ["upload", str(path)])
    assert result.exit_code == 2 and "no server configured" in result.stderr


def test_errors_say_what_and_where_the_server_url_comes_from(tmp_path, monkeypatch):
    """No Python class names; the message says which setting gave the URL; the retry hint keeps
    the options that were given (the token as a placeholder, never its value)."""
    path = tmp_path / "b.json"
    path.write_text(json.dumps(minimal_bundle("x")))
    monkeypatch.delenv("KVREPORT_SERVER", raising=False)
    monkeypatch.delenv("KVREPORT_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["upload", str(path), "--server", "ftp://example.invalid", "--token", "s3cret",
                                       "--json"])
    assert result.exit_code == 2
    err = result.stderr
    assert "InvalidSchema" not in err and "Traceback" not in err
    assert "must start with http:// or https://" in err and "the --server option" in err
    assert f"kvreport upload {path} --server ftp://example.invalid --token <token> --json" in err
    assert "s3cret" not in err

    monkeypatch.setenv("KVREPORT_SERVER", "http://127.0.0.1:9")
    result = CliRunner().invoke(main, ["upload", str(path), "--token", "t"])
    err = result.stderr
    assert result.exit_code == 2 and "ConnectionError" not in err
    assert "could not reach http://127.0.0.1:9: nothing answered" in err
    assert "KVREPORT_SERVER environment variable" in err
    assert "--server" not in err.split("retry with:")[1]

    monkeypatch.delenv("KVREPORT_SERVER")
    result = CliRunner().invoke(main, ["upload", str(path)])
    assert "no server configured" in result.stderr and "KVREPORT_SERVER" in result.stderr
    assert "--server URL" in result.stderr and "config.ini" in result.stderr
