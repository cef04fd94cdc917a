"""SIGKILL of gunicorn in the middle of a stream of uploads (PostgreSQL): no acknowledged bundle is
lost, nothing is half-written, and the counters still equal a full scan."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from server_helpers import (
    FAILURE_CASES,
    assert_consistent,
    bundle_from_case,
    create_pg_database,
    drop_pg_database,
)
from sqlalchemy import func, select

from kvreport_server import auth, migrate
from kvreport_server.db import Database
from kvreport_server.models import Bundle, Cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "KVREPORT_DATABASE_URL": url, "KVREPORT_LOG_REQUESTS": "0",
           "KVREPORT_SECRET_KEY": "durability"}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--workers", "2", "--threads", "4",
                             "--bind", f"127.0.0.1:{port}", "kvreport_server:create_app()"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except requests.RequestException:
            time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("gunicorn did not start")


@pytest.fixture
def pg_fresh():
    url = create_pg_database("kvr_kill")
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


def test_sigkill_loses_no_acknowledged_bundle(pg_fresh):
    db = Database(pg_fresh)
    with db.Session() as s, s.begin():
        token = auth.new_token(s, "kill", "upload")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    templates = [bundle_from_case(c) for c in FAILURE_CASES[:4]]
    acked: set[str] = set()
    sent: list[dict] = []
    lock = threading.Lock()
    stop = threading.Event()

    def uploader(k: int):
        from kvreport.bundle import new_bundle_id

        session = requests.Session()
        i = 0
        while not stop.is_set():
            b = dict(templates[(k + i) % len(templates)], id=new_bundle_id())
            i += 1
            with lock:
                sent.append(b)
            try:
                r = session.post(base + "/api/v1/bundles", data=json.dumps(b), headers=headers, timeout=10)
            except requests.RequestException:
                continue
            if r.status_code in (200, 201):
                with lock:
                    acked.add(b["id"])

    proc = start_gunicorn(pg_fresh, port)
    threads = [threading.Thread(target=uploader, args=(k,), daemon=True) for k in range(6)]
    for t in threads:
        t.start()
    waited = time.time() + 30
    while len(acked) < 30 and time.time() < waited:
        time.sleep(0.1)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # master and workers, mid-stream
    proc.wait(10)
    stop.set()
    for t in threads:
        t.join(15)
    assert len(acked) > 10, "too few uploads before the kill to mean anything"

    with db.Session() as s:
        stored = set(s.execute(select(Bundle.id)).scalars())
        total = s.execute(select(func.coalesce(func.sum(Cluster.count), 0))).scalar_one()
    assert acked <= stored, f"{len(acked - stored)} acknowledged bundles lost"
    assert total == len(stored)
    assert_consistent(db)

    # after a restart, re-sending everything is safe: 200 for stored ones, 201 for the rest
    proc = start_gunicorn(pg_fresh, port)
    try:
        codes = []
        for b in sent:
            r = requests.post(base + "/api/v1/bundles", data=json.dumps(b), headers=headers, timeout=10)
            codes.append(r.status_code)
            assert r.status_code == (200 if b["id"] in stored else 201)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    with db.Session() as s:
        assert s.execute(select(func.count()).select_from(Bundle)).scalar_one() == len({b["id"] for b in sent})
    assert_consistent(db)
    db.dispose()
