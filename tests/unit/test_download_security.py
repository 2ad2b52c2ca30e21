"""Downloads as an attacker would bend them: an https URL redirected to plain http, a stream without
a length that never ends, a trickle of a byte at a time, and a co-user's folder or link planted in a
group-shared TORCH_HOME. The server is a real https one on loopback, its self-signed certificate
trusted through SSL_CERT_FILE."""
import fcntl
import http.server
import os
import shutil
import ssl
import subprocess
import threading
import types
from pathlib import Path
from typing import Dict, Iterator

import pytest
import torch
from helpers import CAP_CHOWN, has_capability, require_capability

from xcit_dense.io import download
from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.io.download import ALLOW_HTTP, MAX_BYTES, MIN_RATE, DownloadError, cache_path
from xcit_dense.io.weights import read_checkpoint

MIB = 1 << 20


@pytest.fixture
def https_server(tmp_path, monkeypatch, file_server) -> Iterator[Dict]:
    """An https server on 127.0.0.1: /model.pth (a checkpoint), /to-http and /to-https (redirects to
    the plain http ``file_server``'s copy and to /model.pth), /endless (3 MiB without a length),
    /declared (a length of 3 MiB declared) and /trickle (a byte each time the ``trickle`` event is set,
    without end)."""
    require_capability('openssl', shutil.which('openssl') is not None,
                       "no openssl, which makes the test server's certificate")
    cert, key = tmp_path / 'cert.pem', tmp_path / 'key.pem'
    subprocess.run(['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=127.0.0.1',
                    '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', str(key), '-out', str(cert)],
                   check=True, capture_output=True)
    monkeypatch.setenv('SSL_CERT_FILE', str(cert))
    monkeypatch.delenv(ALLOW_HTTP, raising=False)
    www = tmp_path / 'https'
    www.mkdir()
    torch.save({'state_dict': {'w': torch.arange(3.0)}}, www / 'model.pth')
    (file_server['root'] / 'model.pth').write_bytes((www / 'model.pth').read_bytes())
    served, trickle, stop = [], threading.Event(), threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            served.append(self.path)
            base = f'https://127.0.0.1:{self.server.server_address[1]}'
            redirects = {'/to-http': f"{file_server['url']}/model.pth", '/to-https': f'{base}/model.pth'}
            if self.path in redirects:
                self.send_response(302)
                self.send_header('Location', redirects[self.path])
                self.end_headers()
            elif self.path == '/model.pth':
                body = (www / 'model.pth').read_bytes()
                self.send_response(200)
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path in ('/endless', '/declared'):
                self.send_response(200)
                if self.path == '/declared':
                    self.send_header('Content-Length', str(3 * MIB))
                self.end_headers()
                try:
                    for _ in range(3 * 16):
                        self.wfile.write(b'\0' * (MIB // 16))
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    pass  # the client stopped reading at its limit
            elif self.path == '/trickle':
                self.send_response(200)
                self.end_headers()
                try:
                    while trickle.wait(timeout=60) and not stop.is_set():  # the timeout bounds a hang only
                        trickle.clear()
                        self.wfile.write(b'x')
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    pass  # the client stopped reading
            else:
                self.send_error(404)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        protocol_version = 'HTTP/1.0'  # the end of a body without a length is the connection's end

    server = Server(('127.0.0.1', 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield dict(url=f'https://127.0.0.1:{server.server_address[1]}', served=served, http=file_server,
                   trickle=trickle)
    finally:
        stop.set()
        trickle.set()
        server.shutdown()
        server.server_close()
        thread.join()


def test_https_redirects_stay_https_and_the_log_names_the_source(https_server, monkeypatch):
    """Before, urllib followed https -> http silently and the log named only the https URL."""
    with pytest.raises(CheckpointError,
                       match=r'model\.pth \(redirected from https://.*/to-http\): plain http is refused'):
        read_checkpoint(f"{https_server['url']}/to-http")
    assert https_server['http']['hits'] == {}  # the http copy was never asked for
    assert not os.path.exists(cache_path(f"{https_server['url']}/to-http"))
    logged = []
    monkeypatch.setattr(download, 'print_log', lambda message, **kwargs: logged.append(message))
    checkpoint = read_checkpoint(f"{https_server['url']}/to-https")
    assert torch.equal(checkpoint['state_dict']['w'], torch.arange(3.0))
    assert any(f"(redirected to {https_server['url']}/model.pth)" in line for line in logged), logged


@pytest.mark.parametrize('path', ['/endless', '/declared'])
def test_a_download_stops_at_the_size_limit(https_server, monkeypatch, path):
    """3 MiB against a 1 MiB limit: refused, with or without a declared length; nothing is cached."""
    monkeypatch.setenv(MAX_BYTES, str(MIB))
    url = https_server['url'] + path
    with pytest.raises(CheckpointError, match=rf'over the limit of {MIB}|more than {MIB} bytes'):
        read_checkpoint(url)
    folder = Path(cache_path(url)).parent
    assert sorted(p.name for p in folder.iterdir()) == ['.lock']  # no file, no partial one


def test_a_trickle_is_stopped_at_the_rate_floor_and_the_lock_released(https_server, monkeypatch):
    """A server that sends a byte at a time, each read taking 10 s on an injected clock (each tick lets
    the server send the next byte): before, each read waited only for its own 60 s timeout, so the
    download, and the cache's lock every other process waits on, lasted without end. Stopped at the
    first read past the 60 s grace, under the 16 KiB/s default floor; the lock is free, nothing cached."""
    monkeypatch.delenv(MIN_RATE, raising=False)
    clock = types.SimpleNamespace(now=0)

    def tick():
        clock.now += 10
        https_server['trickle'].set()
        return clock.now

    monkeypatch.setattr(download, 'time', types.SimpleNamespace(monotonic=tick))
    url = https_server['url'] + '/trickle'
    with pytest.raises(CheckpointError, match=rf'/trickle sent 7 bytes in 70 s, under the floor of {16 << 10} '
                                              rf'bytes a second \({MIN_RATE}\): stopped'):
        read_checkpoint(url)
    folder = Path(cache_path(url)).parent
    assert sorted(p.name for p in folder.iterdir()) == ['.lock']  # no file, no partial one
    with open(folder / '.lock', 'rb') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: raises BlockingIOError while held


def test_a_planted_cache_folder_or_link_is_refused(https_server, tmp_path):
    """A co-user of a group-shared TORCH_HOME plants the URL's cache folder (its name is predictable):
    as a link to the victim's ~/.ssh, as their own folder, or as a folder whose .lock is a link."""
    url = f"{https_server['url']}/model.pth"
    folder = Path(cache_path(url)).parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    victim = tmp_path / 'victim_ssh'
    victim.mkdir()
    folder.symlink_to(victim)
    with pytest.raises(CheckpointError, match='refused'):
        read_checkpoint(url)
    assert list(victim.iterdir()) == []  # before: .lock and model.pth landed here
    folder.unlink()
    folder.mkdir()
    (folder / '.lock').symlink_to(victim / 'authorized_keys')
    with pytest.raises(CheckpointError, match=r'\.lock .*refused'):
        read_checkpoint(url)
    assert list(victim.iterdir()) == []
    (folder / '.lock').unlink()
    assert torch.equal(read_checkpoint(url)['state_dict']['w'], torch.arange(3.0))  # the user's own folder


def test_a_cache_folder_of_another_user_is_refused(https_server):
    """The URL's cache folder planted by another user (owned by nobody): refused, nothing written."""
    require_capability('chown', has_capability(CAP_CHOWN), 'giving a folder to another user needs CAP_CHOWN')
    url = f"{https_server['url']}/model.pth"
    folder = Path(cache_path(url)).parent
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, 65534, 65534)  # nobody's
    with pytest.raises(CheckpointError, match='belongs to another user'):
        read_checkpoint(url)
    assert list(folder.iterdir()) == []
    os.chown(folder, os.geteuid(), os.getegid())
    assert torch.equal(read_checkpoint(url)['state_dict']['w'], torch.arange(3.0))  # the user's own folder


def test_a_bad_size_limit_or_rate_floor_is_named(monkeypatch):
    monkeypatch.setenv(MAX_BYTES, 'lots')
    with pytest.raises(DownloadError, match=f"{MAX_BYTES}='lots' is not a number"):
        download.max_download_bytes()
    for value in ('fast', '-1'):
        monkeypatch.setenv(MIN_RATE, value)
        with pytest.raises(DownloadError, match=f"{MIN_RATE}='{value}' is not a number of bytes a second"):
            download.min_download_rate()
