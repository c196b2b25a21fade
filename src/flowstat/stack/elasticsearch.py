"""Elasticsearch from Maven Central's integ-test-zip (no Docker, no bundled JDK needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import requests

from .base import Service, StackError

ES_VERSION = os.environ.get("FLOWSTAT_ES_VERSION", "8.19.21")
ARTIFACT = "org.elasticsearch.distribution.integ-test-zip:elasticsearch:{v}:zip"
JAVA_HOMES = ("/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/java-21-openjdk-amd64",
              "/usr/lib/jvm/temurin-25-jdk-amd64")


def m2_zip(version: str) -> Path:
    return (Path.home() / ".m2" / "repository" / "org" / "elasticsearch" / "distribution" / "integ-test-zip" /
            "elasticsearch" / version / f"elasticsearch-{version}.zip")


def unzip_keeping_modes(archive: Path, dest: Path) -> None:
    """zipfile drops permission bits; scripts under bin/ must stay executable."""
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            z.extract(info, dest)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(dest / info.filename, mode & 0o7777)


class Elasticsearch(Service):
    health_timeout_s = 120.0
    default_port = 9200
    port_option = "es-port"
    port_help = "Elasticsearch's HTTP port (its transport port is P+100)"
    store = "elasticsearch"

    @property
    def transport_port(self) -> int:
        return self.extra.get("transport_port", self.port + 100)

    def ports(self) -> list[int]:
        return [self.port, self.transport_port]

    @property
    def dist(self) -> Path:
        return self.home / f"elasticsearch-{ES_VERSION}"

    def owned_paths(self) -> list[Path]:
        return [self.home]

    def install(self) -> None:
        (self.home / "data").mkdir(exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        if (self.dist / "bin" / "elasticsearch").exists():
            return
        archive = m2_zip(ES_VERSION)
        if not archive.exists():
            if not shutil.which("mvn"):
                raise StackError("elasticsearch: Maven (mvn) is needed to download the server from Maven Central")
            r = subprocess.run(["mvn", "-q", "dependency:get", f"-Dartifact={ARTIFACT.format(v=ES_VERSION)}",
                                "-Dtransitive=false"], capture_output=True, text=True)
            if r.returncode != 0 or not archive.exists():
                raise StackError(f"elasticsearch: download of {ARTIFACT.format(v=ES_VERSION)} failed: "
                                 f"{(r.stdout + r.stderr).strip()[-500:]}")
        try:
            unzip_keeping_modes(archive, self.home)
        except (zipfile.BadZipFile, OSError) as exc:
            raise StackError(f"elasticsearch: cannot unpack {archive} ({exc}); delete it to download it again") from exc

    def java_home(self) -> str:
        for home in (os.environ.get("ES_JAVA_HOME"), *JAVA_HOMES):
            if home and Path(home, "bin", "java").exists():
                return home
        raise StackError("elasticsearch: no Java 17+ found (set ES_JAVA_HOME)")

    def command(self):
        cmd = [str(self.dist / "bin" / "elasticsearch"), "-E", "discovery.type=single-node",
               "-E", f"http.port={self.port}", "-E", f"transport.port={self.transport_port}",
               "-E", "network.host=127.0.0.1", "-E", "xpack.security.enabled=false",
               "-E", f"path.data={self.home / 'data'}", "-E", f"path.logs={self.home / 'logs'}",
               "-E", "cluster.routing.allocation.disk.threshold_enabled=false"]
        env = {"ES_JAVA_HOME": self.java_home(), "ES_JAVA_OPTS": self.extra.get("java_opts", "-Xms512m -Xmx512m")}
        return cmd, env

    def healthy(self) -> bool:
        try:
            r = self.get("/_cluster/health")
            return r.status_code == 200 and r.json().get("status") in ("green", "yellow")
        except (requests.RequestException, ValueError):
            return False
