"""/metrics beyond loopback (issue 45): both agents' prometheus:// sink with ?web_config=PATH, an
exporter-toolkit web-config.yml (TLS, basic authentication), alike. A scrape with a user's password
over TLS is answered; a wrong or missing one is 401 and changes nothing; plain HTTP, a stalled or a
failed handshake never keep the others waiting; a real Prometheus scrapes it with basic_auth and a CA
file; a file that cannot be used, or another address without TLS and a user, is refused before the
agent starts (and before anything is bound: nothing here listens beyond 127.0.0.0/8). After the
start, the file (and the certificate it names) changed applies to the next connection, as
exporter-toolkit's does; a file broken after the start refuses scrapes until fixed, said once."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import requests

from flowstat_lab.prometheus import PrometheusServer
from support.agents import sleeper, wait_until
from support.common import free_port

USER, PASSWORD = "prometheus", "s3cret pass:word"


def bcrypt(password: str, cost: int = 4, prefix: bytes = b"$2y$") -> str:
    """A bcrypt hash of password, as htpasswd -B writes it (libxcrypt: crypt_gensalt_rn, crypt)."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt"))
    lib.crypt_gensalt_rn.restype = lib.crypt.restype = ctypes.c_char_p
    out = ctypes.create_string_buffer(64)
    setting = lib.crypt_gensalt_rn(prefix, cost, None, 0, out, len(out))
    return lib.crypt(password.encode(), setting).decode()


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A folder: a CA (ca.crt) and the server's certificate for 127.0.0.1 it signed (server.crt,
    server.key); a client's certificate signed by another CA (clients-ca.crt, client.crt, client.key).
    Made once a module (a worker's tests write their web.yml in it one after the other); P-256 keys,
    made in milliseconds where RSA's took a second of CPU a test."""
    d = tmp_path_factory.mktemp("pki")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca, leaf, cn in (("ca", "server", "127.0.0.1"), ("clients-ca", "client", "scraper")):
        openssl("req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                "-days", "2", "-subj", f"/CN=flowstat test {ca}", cwd=d)  # fmt: skip
        openssl("req", *key, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={cn}", cwd=d)
        openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
                "-out", f"{leaf}.crt", "-days", "2", "-extfile", "san.cnf", cwd=d)  # fmt: skip
    return d


def web_config(pki: Path, text: str | None = None, cost: int = 4) -> Path:
    """pki/web.yml: TLS with the server's certificate (paths relative to it) and USER's PASSWORD."""
    path = pki / "web.yml"
    path.write_text(
        text
        if text is not None
        else "# exporter-toolkit's format\ntls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"basic_auth_users:\n  {USER}: '{bcrypt(PASSWORD, cost)}'\n  other: {bcrypt('x')}\n"
    )
    return path


def start(agent_command, tmp_path: Path, port: int, config: Path, pid: int, interval: float = 0.2):
    """The agent sampling pid, serving /metrics with config, and writing its samples to a file;
    run from / (the config's relative paths are its folder's, not the agent's)."""
    args = [*agent_command, "--pid", str(pid), "--interval", str(interval), "--self-interval", str(interval)]
    args += ["--duration", "60", "--drain-timeout", "0"]  # stopped at once: test_prometheus.py tests the drain
    args += ["--sink", f"prometheus://127.0.0.1:{port}?web_config={config}"]
    args += ["--sink", f"file://{tmp_path}/samples.json?format=json"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


def scrape(port: int, ca: Path, auth: tuple[str, str] | None = (USER, PASSWORD), **kw) -> requests.Response:
    return requests.get(f"https://127.0.0.1:{port}/metrics", auth=auth, verify=str(ca), timeout=10, **kw)


def served(port: int, ca: Path) -> bool:
    try:
        return "flowstat_agent_rounds" in scrape(port, ca).text
    except requests.ConnectionError:
        return False


def written(tmp_path: Path) -> list[dict]:
    path = tmp_path / "samples.json"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def stop(agent: subprocess.Popen, *others: subprocess.Popen) -> str:
    for p in (agent, *others):
        p.terminate()
    for p in (agent, *others):
        p.wait(30)
    return agent.stderr.read() if agent.stderr else ""


def refused(agent_command, url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*agent_command, "--pid", "1", "--count", "1", "--sink", url], capture_output=True, text=True, timeout=60
    )


def test_a_scrape_over_tls_with_a_users_password_gets_the_families(agent_command, tmp_path, pki):
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, web_config(pki), idle.pid)
    try:
        wait_until(lambda: served(port, pki / "ca.crt"), "a self-sample on /metrics over TLS")
        om = scrape(port, pki / "ca.crt", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.status_code == 200 and om.text.endswith("# EOF\n")
        assert f'-{idle.pid}"' in om.text and "flowstat_node_resident_memory_bytes{" in om.text
        assert "flowstat_agent_rounds_total{" in om.text and "process_cpu_seconds_total " in om.text
        assert scrape(port, pki / "ca.crt").headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert scrape(port, pki / "ca.crt", auth=("other", "x")).status_code == 200  # every user listed
    finally:
        log = stop(agent, idle)
    assert f"serving /metrics on https://127.0.0.1:{port}/metrics" in log, log
    assert PASSWORD not in log and "s3cret" not in log


def test_a_wrong_or_missing_password_is_401_and_the_scrape_changes_nothing(agent_command, tmp_path, pki):
    """A node gone is shown two more scrapes: scrapes refused before them leave both to come."""
    port, busy = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, web_config(pki), busy.pid)
    ca = pki / "ca.crt"
    try:
        wait_until(lambda: served(port, ca), "a self-sample on /metrics over TLS")
        busy.kill()  # after the scrapes that waited for the agent: none of them saw it gone
        busy.wait(30)
        wait_until(lambda: any(d.get("node_state") == "DOWN" for d in written(tmp_path)), "the node reported DOWN")
        time.sleep(0.5)  # the prometheus sink's delivery of that round too (its own thread)
        refusals = [
            scrape(port, ca, auth=(USER, "wrong")),
            scrape(port, ca, auth=("nobody", PASSWORD)),
            scrape(port, ca, auth=(USER, PASSWORD + "x")),
            scrape(port, ca, auth=None),
            scrape(port, ca, auth=None, headers={"Authorization": "Basic !!not base64"}),
            scrape(port, ca, auth=None, headers={"Authorization": f"Bearer {PASSWORD}"}),
            scrape(port, ca, auth=(USER, "wrong")),
        ]
        scrapes = [scrape(port, ca).text for _ in range(2)]
        # then it goes (the Python agent answers scrapes between two samples from one rendering)
        wait_until(lambda: f"-{busy.pid}" not in scrape(port, ca).text, "the gone node dropped", timeout=10)
    finally:
        stop(agent)
    for r in refusals:
        assert r.status_code == 401, (r.status_code, r.text)
        assert r.headers["WWW-Authenticate"] == 'Basic realm="flowstat"'
        assert r.text == "Unauthorized\n" and "flowstat_" not in r.text
    down = rf'flowstat_node_state{{[^}}]*-{busy.pid}",.*flowstat_node_state="DOWN"}} 1\n'
    assert re.search(down, scrapes[0]) and re.search(down, scrapes[1])  # the refusals counted for nothing


def test_a_users_password_is_checked_once_then_remembered(agent_command, tmp_path, pki):
    """bcrypt at cost 12 (about 0.25 s): each scrape with a wrong password pays it; the right one,
    after its first check, does not."""
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, web_config(pki, cost=12), idle.pid)
    ca = pki / "ca.crt"
    try:
        wait_until(lambda: served(port, ca), "a self-sample on /metrics over TLS", timeout=30)

        def timed(auth: tuple[str, str]) -> float:
            t = time.monotonic()
            scrape(port, ca, auth=auth)
            return time.monotonic() - t

        wrong = min(timed((USER, "wrong")) for _ in range(2))
        right = max(timed((USER, PASSWORD)) for _ in range(3))
    finally:
        stop(agent, idle)
    assert right < wrong / 2, (right, wrong)


def test_plain_http_a_stalled_or_failed_handshake_never_keep_the_others_waiting(agent_command, tmp_path, pki):
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, web_config(pki), idle.pid)
    ca = pki / "ca.crt"
    try:
        wait_until(lambda: served(port, ca), "a self-sample on /metrics over TLS")
        plain = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert plain.status_code == 400 and "HTTP request to an HTTPS server" in plain.text
        stalled = []
        for _ in range(2):  # with the silent one, fewer than the Python agent's serving threads (4)
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's first bytes, no more
            stalled.append(s)
        silent = socket.create_connection(("127.0.0.1", port))  # connects, sends nothing
        bad = socket.create_connection(("127.0.0.1", port))
        bad.sendall(b"\x16\x03\x01\x00\x05hello" + bytes(200))  # a handshake record that is none
        untrusting = ssl.create_default_context()  # no CA of ours: its handshake fails on its side
        with pytest.raises(ssl.SSLError):
            with socket.create_connection(("127.0.0.1", port)) as raw:
                untrusting.wrap_socket(raw, server_hostname="127.0.0.1")
        count = len(written(tmp_path))
        t = time.monotonic()
        for _ in range(3):
            assert scrape(port, ca).status_code == 200
        assert time.monotonic() - t < 3  # not after the stalled clients' time-out (5 s)
        wait_until(lambda: len(written(tmp_path)) >= count + 5, "samples while clients hang", timeout=10)
        bad.settimeout(10)
        with pytest.raises(ConnectionResetError):  # its handshake failed: closed, what it sent unread (not hung)
            while bad.recv(100):  # an alert first, maybe
                pass
        stalled[0].settimeout(10)
        t = time.monotonic()
        assert stalled[0].recv(100) == b""  # let go at the client time-out, as a silent plain client
        assert time.monotonic() - t < 8
        for s in [*stalled, silent, bad]:
            s.close()
    finally:
        log = stop(agent, idle)
    assert agent.returncode == 0, log


def test_client_certificates_and_min_version_as_the_web_config_says(agent_command, tmp_path, pki):
    text = (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_ca_file: clients-ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n  min_version: TLS13\n"
    )
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, web_config(pki, text), idle.pid)
    ca, cert = pki / "ca.crt", (str(pki / "client.crt"), str(pki / "client.key"))
    try:
        wait_until(lambda: scrape_ok(port, ca, cert), "a scrape with the client's certificate")
        with pytest.raises(requests.exceptions.SSLError):  # none: refused in the handshake
            requests.get(f"https://127.0.0.1:{port}/metrics", verify=str(ca), timeout=10)
        old = ssl.create_default_context(cafile=str(ca))
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        old.load_cert_chain(*cert)
        with pytest.raises(ssl.SSLError):
            with socket.create_connection(("127.0.0.1", port)) as raw:
                old.wrap_socket(raw, server_hostname="127.0.0.1")
        assert requests.get(f"https://127.0.0.1:{port}/metrics", verify=str(ca), cert=cert, timeout=10).ok
    finally:
        stop(agent, idle)


def scrape_ok(port: int, ca: Path, cert: tuple[str, str]) -> bool:
    try:
        return requests.get(f"https://127.0.0.1:{port}/metrics", verify=str(ca), cert=cert, timeout=10).ok
    except requests.ConnectionError:
        return False


def test_a_prometheus_scrapes_the_agent_with_basic_auth_and_its_ca_file(agent_command, tmp_path, pki):
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, web_config(pki), idle.pid, interval=0.5)
    job = {
        "targets": [f"127.0.0.1:{port}"],
        "scheme": "https",
        "tls_config": {"ca_file": str(pki / "ca.crt")},
        "basic_auth": {"username": USER, "password": PASSWORD},
    }
    try:
        wait_until(lambda: served(port, pki / "ca.crt"), "a self-sample on /metrics over TLS")
        with PrometheusServer(tmp_path / "prom", free_port(), {"agent": job}, 1.0) as prom:
            prom.wait_for_scrapes("agent", 3)
            (target,) = prom.targets()
            rounds = prom.query('flowstat_agent_rounds_total{job="agent"}')
            vmrss = prom.query(f'flowstat_node_resident_memory_bytes{{node_id=~".*-{idle.pid}"}}')
    finally:
        stop(agent, idle)
    assert target["health"] == "up" and target["scrapeUrl"].startswith("https://"), target
    assert rounds and float(rounds[0]["value"][1]) >= 1
    assert vmrss and float(vmrss[0]["value"][1]) > 0


BAD = {
    "an unknown key": ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  certfile: x\n",
                       "tls_server_config.certfile: unknown key"),
    "an unknown key at the top": ("tls_config:\n  cert_file: server.crt\n", "tls_config: unknown key"),
    "exporter-toolkit's key flowstat does not do": ("rate_limit:\n  burst: 2\n",
                                                     "rate_limit: exporter-toolkit's, but not supported"),
    "a missing cert file": ("tls_server_config:\n  cert_file: gone.crt\n  key_file: server.key\n",
                            "tls_server_config.cert_file: cannot read {pki}/gone.crt: No such file"),
    "no key file": ("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config.key_file: missing"),
    "a key not the certificate's": ("tls_server_config:\n  cert_file: server.crt\n  key_file: client.key\n",
                                    "tls_server_config.key_file: cannot use {pki}/client.key with"),
    "a hash not bcrypt's": ("basic_auth_users:\n  alice: '$6$salt$abcdef'\n",
                            "basic_auth_users.alice: not a bcrypt hash"),
    "a password in clear": ("basic_auth_users:\n  alice: secret\n", "basic_auth_users.alice: not a bcrypt hash"),
    "a client CA without client auth": (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: clients-ca.crt\n",
        "tls_server_config.client_ca_file: given, but client_auth_type is NoClientCert"),
    "an old TLS": ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS10\n",
                   "tls_server_config.min_version: TLS12 or TLS13, not 'TLS10'"),
    "not a mapping": ("- tls_server_config\n", "the file: must be a mapping"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_a_web_config_that_cannot_be_used_stops_the_agent_naming_file_and_key(agent_command, pki, case):
    text, said = BAD[case]
    path = web_config(pki, text)
    url = f"prometheus://127.0.0.1:{free_port()}?web_config={path}"
    out = refused(agent_command, url)
    assert out.returncode != 0 and f"{url}: web_config {path}: {said.format(pki=pki)}" in out.stderr, out.stderr


def test_a_web_config_that_cannot_be_read_or_parsed_is_refused(agent_command, pki):
    url = f"prometheus://127.0.0.1:{free_port()}?web_config={pki}/none.yml"
    out = refused(agent_command, url)
    assert out.returncode != 0 and f"web_config {pki}/none.yml: cannot read it: No such file" in out.stderr
    path = web_config(pki, "tls_server_config: [unclosed\n")
    out = refused(agent_command, f"prometheus://127.0.0.1:{free_port()}?web_config={path}")
    assert out.returncode != 0 and f"web_config {path}: not YAML: " in out.stderr, out.stderr


@pytest.mark.parametrize("given", ["nothing", "TLS without users", "users without TLS"])
@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "[::]", "metrics.example.com"])
def test_another_address_needs_tls_and_a_user_and_is_refused_before_any_bind(agent_command, pki, host, given):
    tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    users = f"basic_auth_users:\n  {USER}: '{bcrypt(PASSWORD)}'\n"
    texts = {"TLS without users": tls, "users without TLS": users}
    query = f"?web_config={web_config(pki, texts[given])}" if given in texts else ""
    url = f"prometheus://{host}:9464{query}"
    out = refused(agent_command, url)
    assert out.returncode != 0, out.stderr
    assert (
        f"{url}: /metrics is served on loopback only (127.0.0.1, ::1) unless a web_config gives it TLS and "
        "basic_auth_users" in out.stderr
    ), out.stderr
    assert "cannot listen" not in out.stderr


def test_web_config_is_for_prometheus_only_and_named_in_help(agent_command, pki):
    url = f"tcp://127.0.0.1:9?web_config={web_config(pki)}"
    out = refused(agent_command, url)
    assert out.returncode != 0 and f"{url}: web_config is for prometheus:// only" in out.stderr, out.stderr
    help_text = subprocess.run([*agent_command, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "?web_config=PATH" in help_text and "exporter-toolkit" in help_text


# -- the file changed after the start: read again at the next connection (webconfig.Watched, webconfig_reload)

TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"


def users(**passwords: str) -> str:
    return "basic_auth_users:\n" + "".join(f"  {u}: '{bcrypt(p)}'\n" for u, p in passwords.items())


def atomically(path: Path, text: str) -> None:
    """As an editor saving to a new file then `mv` does: the path gets another inode."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def own_pki(pki: Path, tmp_path: Path) -> Path:
    """A copy of the module's CA and server certificate, for a test to rewrite (its web.yml, its certificate)."""
    d = tmp_path / "pki"
    d.mkdir()
    for name in ("ca.crt", "ca.key", "server.crt", "server.key", "san.cnf"):
        shutil.copy(pki / name, d / name)
    return d


def new_server_certificate(d: Path, name: str) -> None:
    """d/NAME.crt and d/NAME.key: another certificate of the server's, from the same CA."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", "/CN=127.0.0.1", cwd=d)  # fmt: skip
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", "san.cnf", cwd=d)  # fmt: skip


def fingerprint(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


def presented(port: int, ca: Path) -> str:
    """The fingerprint of the certificate the agent presents in a handshake (then closed: no request)."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def lines(log: str, *parts: str) -> list[str]:
    return [line for line in log.splitlines() if all(p in line for p in parts)]


def test_users_changed_in_the_file_apply_to_the_next_scrape_without_a_restart(agent_command, tmp_path, pki):
    """Rewritten as `mv` does (a new inode), then in place (the same inode, another size): each time
    the next scrape goes by the new users; a password the agent remembered for a user is forgotten
    with the file it was checked against."""
    d = own_pki(pki, tmp_path)
    path = web_config(d, TLS + users(**{USER: PASSWORD}))
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, path, idle.pid)
    ca = d / "ca.crt"
    try:
        wait_until(lambda: served(port, ca), "a self-sample on /metrics over TLS")
        assert scrape(port, ca).status_code == 200  # USER's password checked, and remembered
        atomically(path, TLS + users(bob="bob's password"))
        assert scrape(port, ca, auth=("bob", "bob's password")).status_code == 200
        assert scrape(port, ca).status_code == 401
        before = path.stat()
        path.write_text(TLS + users(**{USER: "a new password"}))  # in place: only its size and mtime tell
        assert path.stat().st_ino == before.st_ino and path.stat().st_size != before.st_size
        assert scrape(port, ca).status_code == 401  # its old password, remembered before: forgotten
        assert scrape(port, ca, auth=(USER, "a new password")).status_code == 200
        assert scrape(port, ca, auth=("bob", "bob's password")).status_code == 401
    finally:
        log = stop(agent, idle)
    assert len(lines(log, f"web_config {path}: read again (1 users)")) == 2, log
    assert "bob's password" not in log and "a new password" not in log


def test_a_certificate_changed_is_presented_at_the_next_handshake(agent_command, tmp_path, pki):
    """Its files replaced under the same names (the web-config untouched, as a certificate renewal
    does), then the web-config naming others: the next handshake presents the new one."""
    d = own_pki(pki, tmp_path)
    path = web_config(d, TLS + users(**{USER: PASSWORD}))
    new_server_certificate(d, "renewed")
    new_server_certificate(d, "other")
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, path, idle.pid)
    ca = d / "ca.crt"
    try:
        wait_until(lambda: served(port, ca), "a self-sample on /metrics over TLS")
        first = fingerprint(d / "server.crt")
        assert presented(port, ca) == first
        shutil.copy(d / "renewed.key", d / "server.key.new")
        shutil.copy(d / "renewed.crt", d / "server.crt.new")
        os.replace(d / "server.key.new", d / "server.key")
        os.replace(d / "server.crt.new", d / "server.crt")
        assert presented(port, ca) == fingerprint(d / "renewed.crt") != first
        assert scrape(port, ca).status_code == 200
        atomically(path, TLS.replace("server.", "other.") + users(**{USER: PASSWORD}))
        assert presented(port, ca) == fingerprint(d / "other.crt")
        assert scrape(port, ca).status_code == 200
    finally:
        log = stop(agent, idle)
    assert len(lines(log, f"web_config {path}: read again (1 users)")) == 2, log


def refused_over_tls(port: int, ca: Path) -> bool:
    try:
        scrape(port, ca)
    except requests.ConnectionError:  # its handshake refused (an SSLError is one)
        return True
    return False


def test_a_file_broken_after_the_start_refuses_handshakes_until_fixed_said_once(agent_command, tmp_path, pki):
    """exporter-toolkit's choice (its GetConfigForClient fails the handshake), not the last good
    config kept: a file broken while a user was being removed must not leave that user in. Said in
    one line a change, not one a scrape. TLS or not is the start's: a file without
    tls_server_config is one that cannot be used."""
    d = own_pki(pki, tmp_path)
    good = TLS + users(**{USER: PASSWORD})
    path = web_config(d, good)
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, path, idle.pid)
    ca = d / "ca.crt"
    try:
        wait_until(lambda: served(port, ca), "a self-sample on /metrics over TLS")
        atomically(path, "tls_server_config: [unclosed\n")
        assert all(refused_over_tls(port, ca) for _ in range(3))
        atomically(path, good)
        assert scrape(port, ca).status_code == 200
        atomically(path, users(**{USER: PASSWORD}))  # TLS gone
        assert all(refused_over_tls(port, ca) for _ in range(3))
        atomically(path, TLS.replace("server.key", "gone.key") + users(**{USER: PASSWORD}))
        assert refused_over_tls(port, ca)
        (d / "gone.key").write_bytes((d / "server.key").read_bytes())  # a file it names appears: read again
        assert scrape(port, ca).status_code == 200
    finally:
        log = stop(agent, idle)
    refused_until = "/metrics refused until the file is fixed"
    assert len(lines(log, f"web_config {path}: not YAML: ", refused_until)) == 1, log
    assert len(lines(log, f"web_config {path}: tls_server_config: gone since the start", refused_until)) == 1, log
    assert len(lines(log, f"web_config {path}: tls_server_config.key_file: cannot read {d}/gone.key")) == 1, log
    assert len(lines(log, refused_until)) == 3, log
    assert len(lines(log, f"web_config {path}: read again (1 users)")) == 2, log


def test_without_tls_a_file_broken_after_the_start_is_answered_500(agent_command, tmp_path, pki):
    """On loopback without TLS (users only): a broken file, or one that gained tls_server_config
    (TLS begins at a restart only), is answered 500 as exporter-toolkit's handler answers it; a file
    left with no user serves anyone (the file says so; on loopback only)."""
    d = own_pki(pki, tmp_path)
    path = web_config(d, users(**{USER: PASSWORD}))
    port, idle = free_port(), sleeper(60)
    agent = start(agent_command, tmp_path, port, path, idle.pid)

    def plain(auth: tuple[str, str] | None = (USER, PASSWORD)) -> requests.Response:
        return requests.get(f"http://127.0.0.1:{port}/metrics", auth=auth, timeout=10)

    def up() -> bool:
        try:
            return "flowstat_agent_rounds" in plain().text
        except requests.ConnectionError:
            return False

    try:
        wait_until(up, "a self-sample on /metrics")
        atomically(path, "basic_auth_users: [unclosed\n")
        broken = [plain() for _ in range(3)]
        atomically(path, TLS + users(**{USER: PASSWORD}))
        tls_new = plain()
        atomically(path, users(**{USER: PASSWORD}))
        assert plain().status_code == 200 and plain(auth=None).status_code == 401
        atomically(path, "")
        assert plain(auth=None).status_code == 200
    finally:
        log = stop(agent, idle)
    for r in [*broken, tls_new]:
        assert r.status_code == 500 and r.text == "Internal Server Error\n" and "flowstat_" not in r.text
    assert len(lines(log, f"web_config {path}: not YAML: ")) == 1, log
    assert len(lines(log, f"web_config {path}: tls_server_config: new since the start")) == 1, log
    assert len(lines(log, f"web_config {path}: read again")) == 2, log
