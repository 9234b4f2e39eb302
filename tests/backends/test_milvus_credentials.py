"""Credentials never leave with a persisted folder, and never appear in what we write or show.

The attacks, each from a security review: a folder whose manifest names someone
else's server (a fake server on localhost records whether we connect and what we send); a
manifest naming a local ``.db`` outside the folder (loading must not create it); credentials
inside a URI (``http://user:password@host``) written to ``manifest.json`` or shown in errors.
Wrong implementations caught: a loader that connects to the URI in the manifest; one that
compares only after connecting; a manifest that stores the URI (with or without credentials);
an error message that repeats the URI as given.
"""

from __future__ import annotations

import socket
import threading

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from funnel_core.backends.milvus import (  # noqa: E402
    MilvusBackend,
    MilvusBM25Index,
    MilvusConnectionError,
    load_index,
)
from funnel_core.backends.milvus.client import split_credentials  # noqa: E402
from funnel_core.errors import PersistError  # noqa: E402
from funnel_core.persist import save_snapshot  # noqa: E402
from funnel_core.units import Unit  # noqa: E402

SECRET = "s3cret-Pa55"


class _FakeServer:
    """A TCP listener on localhost that records every connection and the bytes sent to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(0.5)
            try:
                while data := conn.recv(65536):
                    self.received.append(data)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def server():
    s = _FakeServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("milvus_cred") / "cred.db")


def _planted(path, uri: str) -> None:
    """A manifest as someone else (or an older funnel-rag) wrote it: naming where to connect."""
    meta = {"backend": "milvus", "format": MilvusBM25Index.kind, "version": 1, "uri": uri,
            "db_name": None, "collection": "funnel_bm25", "settings": {}, "n_units": 1}
    save_snapshot(path, MilvusBM25Index.kind, 1, lambda folder: meta)


def test_a_folder_never_sends_the_token_to_the_server_it_names(server, tmp_path, db):
    _planted(tmp_path / "evil", f"http://127.0.0.1:{server.port}")
    with pytest.raises(PersistError, match=r"pass the Milvus URI.*uri="):
        MilvusBM25Index.load(tmp_path / "evil", token=f"user:{SECRET}")
    with pytest.raises(PersistError, match=r"another Milvus URI"):
        MilvusBM25Index.load(tmp_path / "evil", uri=db, token=f"user:{SECRET}")
    with pytest.raises(PersistError, match=r"pass the Milvus URI"):
        load_index(tmp_path / "evil", token=f"user:{SECRET}")
    assert server.connections == 0 and not server.received


def test_a_local_db_in_a_manifest_creates_no_file_outside_the_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _planted(tmp_path / "folder", str(outside / "planted.db"))
    with pytest.raises(PersistError):
        MilvusBM25Index.load(tmp_path / "folder")
    assert list(outside.iterdir()) == []


def test_credentials_in_a_uri_become_the_token_and_are_never_written_or_shown(tmp_path):
    uri = f"http://admin:{SECRET}@127.0.0.1:1"
    assert split_credentials(uri) == ("http://127.0.0.1:1", f"admin:{SECRET}")
    assert split_credentials("http://a%40b:p%3Aw@h:1/x") == ("http://h:1/x", "a@b:p:w")
    idx = MilvusBM25Index(uri, "creds", timeout=2)
    assert idx.uri == "http://127.0.0.1:1" and idx.token == f"admin:{SECRET}"
    backend = MilvusBackend(uri)
    assert SECRET not in repr(backend) and backend.uri == "http://127.0.0.1:1"
    assert backend.token == f"admin:{SECRET}"
    assert MilvusBackend(uri, token="other").token == "other"  # an explicit token wins
    with pytest.raises(MilvusConnectionError) as err:
        idx.search("x")
    shown = str(err.value) + repr(err.value.__cause__) + repr(err.value.__context__)
    assert SECRET not in str(err.value) and "admin:" not in str(err.value)
    assert err.value.__cause__ is None  # the pymilvus exception (which may hold the URI) is not chained
    assert "127.0.0.1:1" in shown  # the error still says where
    # what a save writes: no URI, no credentials, only a fingerprint
    idx._opened = lambda: {"settings": {"bm25": {}}, "n_units": 0}  # type: ignore[method-assign]
    idx.save(tmp_path / "m")
    written = "".join(f.read_text() for f in (tmp_path / "m").rglob("*") if f.is_file())
    assert SECRET not in written and "admin" not in written and "127.0.0.1" not in written


def test_loading_with_the_callers_uri_and_token(db, tmp_path):
    idx = MilvusBM25Index(db, "cred_ok").index([Unit(id="a", text="alpha beta"), Unit(id="b", text="gamma")])
    idx.save(tmp_path / "ok")
    again = MilvusBM25Index.load(tmp_path / "ok", uri=MilvusBackend(db, db_name=None))
    assert [u.id for u in again.search("alpha")] == ["a"]
    assert [u.id for u in MilvusBM25Index.load(tmp_path / "ok", uri=db).search("gamma")] == ["b"]
