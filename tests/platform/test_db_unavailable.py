"""While the database is unreachable the server answers 503 with Retry-After, never
500: the API (its error JSON), the MLflow endpoints (TEMPORARILY_UNAVAILABLE, which
MLflow clients retry) and the pages; and it answers 200 again once the database is
back. PostgreSQL is reached through a TCP proxy the test stops and starts (a
restart as a client sees it); SQLite through a file that cannot be opened."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

import pytest
from lab_processes import PG_ADMIN_URL, LabStack, _free_port, pg_up

from lab.jobs import launch

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


class TcpProxy:
    """127.0.0.1:port -> target, piping bytes both ways; ``stop`` refuses new
    connections and cuts the open ones, ``start`` listens again on the same port."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.port = target, _free_port()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accepted = 0

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        if self._listener is not None:
            # shutdown first: a plain close leaves a socket blocked in accept() listening
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()


class Client:
    """The stack's token for the API and MLflow, a logged-in session for the pages."""

    def __init__(self, stack: LabStack):
        self.stack, self.base = stack, f"http://127.0.0.1:{stack.port}"
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        page = self.opener.open(self.base + "/accounts/login/").read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        body = urllib.parse.urlencode(
            {"username": "e2e", "password": "pw", "csrfmiddlewaretoken": token}
        )
        self.opener.open(urllib.request.Request(self.base + "/accounts/login/", body.encode()))

    def poll(self) -> list[tuple[str, int, str, str | None]]:
        """(what, status, body, Retry-After) for an API list, MLflow's search, the
        health check and two pages."""
        out = []
        mlflow = json.dumps({"max_results": 5}).encode()
        for what, request, opener in (
            ("api", self._api("/api/runs"), urllib.request.build_opener()),
            ("mlflow", self._api("/api/2.0/mlflow/experiments/search", mlflow), urllib.request.build_opener()),
            ("health", self._api("/api/health"), urllib.request.build_opener()),
            ("page", urllib.request.Request(self.base + "/runs/"), self.opener),
            ("page", urllib.request.Request(self.base + "/queue/"), self.opener),
        ):  # fmt: skip
            try:
                with opener.open(request, timeout=30) as response:
                    out.append((what, response.status, response.read().decode()[:300], None))
            except urllib.error.HTTPError as exc:
                out.append(
                    (what, exc.code, exc.read().decode()[:300], exc.headers.get("Retry-After"))
                )
        return out

    def _api(self, path: str, data: bytes | None = None) -> urllib.request.Request:
        return urllib.request.Request(
            self.base + path, data,
            headers={"Authorization": f"Token {self.stack.token}", "Content-Type": "application/json"},
        )  # fmt: skip


def _restart_web(stack: LabStack, database_url: str) -> None:
    stack.kill("web", 15)
    stack.env["DATABASE_URL"] = database_url
    stack.start("web", launch.web_command("127.0.0.1", stack.port))
    stack.wait_for(lambda: _answers(stack), 60, "web server")


def _answers(stack: LabStack) -> bool:
    """The server answers HTTP at all (a 503 counts: the database may be away)."""
    try:
        stack.request("GET", "/api/presets")
        return True
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return False


def _unavailable(results) -> None:
    for what, code, body, retry_after in results:
        assert code == 503 and retry_after is not None and int(retry_after) > 0, (what, code, body)
        if what == "mlflow":
            assert json.loads(body)["error_code"] == "TEMPORARILY_UNAVAILABLE"
        if what == "api":
            assert "unreachable" in json.loads(body)["detail"]


def test_postgres_restarting_is_a_503_with_retry_after_then_200(tmp_path, monkeypatch):
    if not pg_up():
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
    monkeypatch.setenv("DATABASE_URL", PG_ADMIN_URL)
    monkeypatch.setenv("DJANGO_SECRET_KEY", "test-only-secret-key")
    stack = LabStack(tmp_path, "filesystem")
    host = urllib.parse.urlparse(PG_ADMIN_URL)
    proxy = TcpProxy((host.hostname or "127.0.0.1", host.port or 5432))
    proxy.start()
    try:
        direct = stack.env["DATABASE_URL"]
        proxied = direct.replace(f":{host.port or 5432}/", f":{proxy.port}/")
        assert proxied != direct
        _restart_web(stack, proxied)
        client = Client(stack)
        before = client.poll()
        assert [code for what, code, *_ in before if what != "health"] == [200] * 4, before
        assert proxy.accepted > 0, (proxied, stack.log("web"))
        for _ in range(2):
            proxy.stop()  # the database goes away: kept connections cut, new ones refused
            for _ in range(3):
                _unavailable(client.poll())
            proxy.start()
            after = client.poll()
            assert [code for what, code, *_ in after if what != "health"] == [200] * 4, after
        assert "Traceback" not in stack.log("web")
    finally:
        proxy.stop()
        stack.close()


def test_sqlite_that_cannot_be_opened_is_a_503(tmp_path):
    stack = LabStack(tmp_path, "filesystem")
    try:
        if stack.pg_db:
            pytest.skip("the suite runs on PostgreSQL: the proxy test covers it")
        client = Client(stack)
        _restart_web(stack, f"sqlite:///{tmp_path / 'gone' / 'db.sqlite3'}")
        _unavailable(client.poll())
    finally:
        stack.close()
