"""flowstat stack: the real servers the other tests use, and its errors."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flowstat.stack import Stack, StackError
from flowstat.stack.base import SERVICE_USER
from support.common import free_port


def test_up_is_idempotent_and_status_says_healthy(stack):
    before = {s["service"]: s["pid"] for s in stack.status()}
    messages = []
    stack.up(report=messages.append)
    starts = [m for m in messages if "log:" in m]  # one per service; the others report the stores' set-up
    assert len(starts) == 4 and all("already running" in m for m in starts)
    after = stack.status()
    assert all(s["healthy"] for s in after) and {s["service"]: s["pid"] for s in after} == before


def test_up_waits_for_a_server_that_runs_but_answers_late(own_stack):
    """A server that runs but is slow to answer (a GC pause, a loaded machine; here InfluxDB stopped
    for 3 s) is waited for, not restarted: `up` again leaves it, and what it holds, alone."""
    service = own_stack["influxdb"]
    pid = service.pid()
    os.killpg(pid, signal.SIGSTOP)
    resume = threading.Timer(3.0, os.killpg, (pid, signal.SIGCONT))
    resume.start()
    try:
        answer = service.up()
    finally:
        resume.cancel()
        if service.pid() == pid:
            os.killpg(pid, signal.SIGCONT)
    assert answer == "already running" and service.pid() == pid


def test_up_on_other_ports_restarts_a_running_server_without_waiting_for_it(own_stack, monkeypatch):
    """A server started on other ports never answers on the ones asked for: no grace for it (were
    there one, this `up` would wait two minutes), it is restarted there at once."""
    service = own_stack["influxdb"]
    old_port, pid = service.port, service.pid()
    monkeypatch.setattr(type(service), "busy_grace_s", 120.0)
    service.port = free_port()
    try:
        done: list[str] = []
        up = threading.Thread(target=lambda: done.append(service.up()), daemon=True)
        up.start()
        up.join(60)  # a restart takes seconds
        assert done and done[0].startswith("started on") and service.pid() != pid, done
        assert service.healthy()
    finally:
        up.join()
        service.port = old_port
        service.up()
    assert service.healthy()


def test_servers_do_not_run_as_root(stack):
    for s in stack.status():
        server_pids = [p for p in (s["pid"],) if p]
        for pid in server_pids:
            children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
            for child in children or [pid]:
                uid = int(open(f"/proc/{child}/status").read().split("Uid:")[1].split()[0])
                assert uid != 0 or os.geteuid() != 0


def test_elasticsearch_and_its_launcher_keep_their_temporary_files_in_the_node_s_own_folder(stack):
    """ES_TMPDIR and the launcher's java.io.tmpdir are the node's tmp/, private to the service user:
    left to /tmp, each start of a node left three folders there for good."""
    es = stack["elasticsearch"]
    pgid = os.getpgid(es.pid())
    javas = subprocess.run(["pgrep", "-g", str(pgid), "-x", "java"], capture_output=True, text=True).stdout.split()
    assert len(javas) == 2, javas  # the launcher, and the server it started
    for pid in javas:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert [a for a in argv if a.startswith(b"-Djava.io.tmpdir=")] == [f"-Djava.io.tmpdir={es.tmp_dir}".encode()]
    info = es.tmp_dir.stat()
    assert info.st_mode & 0o777 == 0o700
    assert os.geteuid() != 0 or pwd.getpwuid(info.st_uid).pw_name == SERVICE_USER


def test_each_start_of_elasticsearch_empties_its_temporary_folder(reachable_tmp, stack):
    """What an earlier start left (the launcher's folders are never removed) goes at the next."""
    from flowstat.stack.elasticsearch import ElasticsearchServer

    es = ElasticsearchServer("elasticsearch", reachable_tmp, free_port())
    es.dist.parent.mkdir(parents=True)
    es.dist.symlink_to(stack["elasticsearch"].dist, target_is_directory=True)  # installed: no unpacking
    left = es.tmp_dir / "final-flags123"
    left.mkdir(parents=True)
    (left / "gc.log").write_text("an earlier start's\n")
    es.install()
    assert list(es.tmp_dir.iterdir()) == [] and es.tmp_dir.stat().st_mode & 0o777 == 0o700


def test_an_install_beside_a_running_elasticsearch_leaves_its_temporary_folder_alone(stack):
    """`flowstat stack install` while the stack is up: emptied (and made again as root's), the folder
    would be lost to the running node."""
    es = stack["elasticsearch"]
    mine = es.tmp_dir / f"install-beside-{os.getpid()}"
    mine.write_text("the running node's\n")
    try:
        es.install()
        assert mine.exists() and es.healthy()
    finally:
        mine.unlink(missing_ok=True)


def test_a_cache_path_with_a_space_keeps_the_launcher_s_options_whole(monkeypatch):
    """The launcher's script splits CLI_JAVA_OPTS on spaces: such a folder is not put there (the
    launcher's files go to /tmp again; the environment's options are left as they are), ES_TMPDIR is."""
    from flowstat.stack.elasticsearch import ElasticsearchServer

    monkeypatch.setenv("CLI_JAVA_OPTS", "-XX:TieredStopAtLevel=1")
    _, spaced = ElasticsearchServer("elasticsearch", Path("/var/lib/my stack"), free_port()).command()
    _, plain = ElasticsearchServer("elasticsearch", Path("/var/lib/stack"), free_port()).command()
    assert "CLI_JAVA_OPTS" not in spaced and spaced["ES_TMPDIR"] == "/var/lib/my stack/elasticsearch/tmp"
    assert plain["CLI_JAVA_OPTS"] == "-XX:TieredStopAtLevel=1 -Djava.io.tmpdir=/var/lib/stack/elasticsearch/tmp"


def test_a_taken_port_is_named(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = blocker.getsockname()[1]
        with pytest.raises(StackError, match=f"port {port} on 127.0.0.1 is taken"):
            Stack(tmp_path, {"influxdb": port}, services=("influxdb",)).up(report=lambda m: None)


def test_cli_status_of_a_stack_that_is_not_running(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "flowstat.cli", "stack", "status", "--cache", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "stopped" in out.stdout


def test_cli_rejects_unknown_services(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "flowstat.cli", "stack", "up", "--only", "mongodb", "--cache", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "unknown service 'mongodb'" in out.stderr


def test_a_server_that_dies_while_starting_is_named_with_its_log(reachable_tmp):
    from flowstat.stack.elasticsearch import ElasticsearchServer

    # A heap of 1 kB: the JVM refuses to start, as a broken server would.
    es = ElasticsearchServer(
        "elasticsearch", reachable_tmp, free_port(), {"java_opts": "-Xmx1k", "transport_port": free_port()}
    )
    with pytest.raises(StackError) as err:
        es.up()
    assert "elasticsearch died while starting" in str(err.value) and str(es.log_path) in str(err.value)
    assert es.pid() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the servers as another user")
def test_a_cache_the_service_user_cannot_enter_is_named(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(StackError) as err:
        Stack(private / "stack", {"influxdb": free_port()}, services=("influxdb",)).up(report=lambda m: None)
    # root owns them all: the service user needs the others' x bit on every folder on the way
    blocked = next(p for p in reversed([private, *private.parents]) if not p.stat().st_mode & 0o001)
    assert f"user flowstat, which cannot enter {blocked} (mode" in str(err.value)
    assert "/var/lib/flowstat/stack" in str(err.value)


def test_root_default_cache_is_outside_its_home(monkeypatch):
    from flowstat.stack import default_cache

    monkeypatch.delenv("FLOWSTAT_CACHE", raising=False)
    if os.geteuid() == 0:
        assert default_cache() == Path("/var/lib/flowstat/stack")
    else:
        assert default_cache().is_relative_to(Path.home())
    monkeypatch.setenv("FLOWSTAT_CACHE", "/somewhere")
    assert default_cache() == Path("/somewhere/stack")
