"""Elasticsearch from Maven Central's integ-test-zip (no Docker, no bundled JDK needed).

``extra={"security": True}`` runs it with xpack security on, as the compose stack runs it: the
``elastic`` user's password is ELASTIC_PASSWORD from the environment (put into the node's keystore
as ``bootstrap.password``, through stdin), and a module flowstat compiles at install time supplies
the analysis components the ``.security`` index needs (see es-analysis/). ``"tls": True`` adds HTTPS
on the HTTP layer, with a CA and a certificate for 127.0.0.1 and localhost that flowstat makes at
install time (``ca_file``: the CA's PEM file, for the clients to trust).

Every Elasticsearch of one cache runs the same unpacked zip (CACHE/elasticsearch/elasticsearch-V);
a secured one keeps its configuration (keystore, certificates) and data in its own folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from importlib.resources import files
from pathlib import Path

import requests

from .base import Service, StackError

ES_VERSION = os.environ.get("FLOWSTAT_ES_VERSION", "8.19.21")
ARTIFACT = "org.elasticsearch.distribution.integ-test-zip:elasticsearch:{v}:zip"
JAVA_HOMES = (
    "/usr/lib/jvm/java-17-openjdk-amd64",
    "/usr/lib/jvm/java-21-openjdk-amd64",
    "/usr/lib/jvm/temurin-25-jdk-amd64",
)
ANALYSIS_FILES = "es-analysis"  # package data: the module's Java source and its descriptor
ANALYSIS_MODULE = "flowstat-security-analysis"  # its folder under the distribution's modules/
ANALYSIS_SOURCE = "FlowstatAnalysisPlugin.java"
ANALYSIS_JAVA_RELEASE = "17"
ELASTIC_USER = "elastic"


def m2_repository() -> Path:
    """Maven's local repository, as flowstat names it to mvn (-Dmaven.repo.local): Java's own idea of
    home is the passwd entry's, not $HOME, and the two differ under sudo or a changed HOME."""
    return Path.home() / ".m2" / "repository"


def m2_zip(version: str) -> Path:
    return (
        m2_repository()
        / "org"
        / "elasticsearch"
        / "distribution"
        / "integ-test-zip"
        / "elasticsearch"
        / version
        / f"elasticsearch-{version}.zip"
    )


def secured_distribution(cache: Path) -> Path:
    """The unpacked zip of CACHE (downloaded and unpacked once) with the analysis module the
    .security index needs compiled into it: what a secured node runs, e.g. in the compose tests'
    Elasticsearch image (lab/src/flowstat_lab/compose.py)."""
    node = ElasticsearchServer("elasticsearch-image", cache, ElasticsearchServer.default_port, extra={"security": True})
    node._unpack()
    node._analysis_module()
    return node.dist


def unzip_keeping_modes(archive: Path, dest: Path) -> None:
    """zipfile drops permission bits; scripts under bin/ must stay executable."""
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            z.extract(info, dest)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(dest / info.filename, mode & 0o7777)


def _run(what: str, cmd: list[str], **kw) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise StackError(
            f"elasticsearch: {what} failed (exit code {r.returncode}): " f"{(r.stdout + r.stderr).strip()[-800:]}"
        )


def _digest(password: str, salt: bytes) -> str:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 200_000).hex()


class ElasticsearchServer(Service):
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
    def secured(self) -> bool:
        return bool(self.extra.get("security") or self.extra.get("tls"))

    @property
    def tls(self) -> bool:
        return bool(self.extra.get("tls"))

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def dist(self) -> Path:
        """The unpacked zip, shared by every Elasticsearch of this cache."""
        return self.cache / "elasticsearch" / f"elasticsearch-{ES_VERSION}"

    @property
    def config_dir(self) -> Path:
        """ES_PATH_CONF: the distribution's own config/, or a copy of it for a secured node."""
        return self.home / "config" if self.secured else self.dist / "config"

    @property
    def ca_file(self) -> Path | None:
        """The PEM file of the CA that signed the node's HTTPS certificate (None without TLS)."""
        return self.config_dir / "certs" / "ca.crt" if self.tls else None

    @property
    def tmp_dir(self) -> Path:
        """ES_TMPDIR, and the launcher's java.io.tmpdir: the node's own, emptied at each start. Left
        to /tmp, each start leaves three folders there (the node's, and two of the launcher's), and a
        system that clears old files from /tmp can take the folder of a node that runs for weeks
        (Elasticsearch's docs ask the archive installs for a private ES_TMPDIR)."""
        return self.home / "tmp"

    def owned_paths(self) -> list[Path]:
        return [self.home, self.dist] if self.dist.parent != self.home else [self.home]

    # -- install ----------------------------------------------------------------------------------
    def install(self) -> None:
        (self.home / "data").mkdir(exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        if self.pid() is None:  # `up` stopped it first; `flowstat stack install` may run beside it
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir.mkdir(mode=0o700, exist_ok=True)
        self._unpack()
        if not self.secured:
            self._plain_keystore()
            return
        self._analysis_module()
        self._config()
        if self.tls:
            self._certificates()
        self._keystore()

    def _unpack(self) -> None:
        if (self.dist / "bin" / "elasticsearch").exists():
            return
        archive = m2_zip(ES_VERSION)
        if not archive.exists():
            if not shutil.which("mvn"):
                raise StackError("elasticsearch: Maven (mvn) is needed to download the server from Maven Central")
            r = subprocess.run(
                [
                    "mvn",
                    "-q",
                    "dependency:get",
                    f"-Dartifact={ARTIFACT.format(v=ES_VERSION)}",
                    "-Dtransitive=false",
                    f"-Dmaven.repo.local={m2_repository()}",
                ],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0 or not archive.exists():
                raise StackError(
                    f"elasticsearch: download of {ARTIFACT.format(v=ES_VERSION)} failed: "
                    f"{(r.stdout + r.stderr).strip()[-500:]}"
                )
        self.dist.parent.mkdir(parents=True, exist_ok=True)
        try:
            unzip_keeping_modes(archive, self.dist.parent)
        except (zipfile.BadZipFile, OSError) as exc:
            raise StackError(f"elasticsearch: cannot unpack {archive} ({exc}); delete it to download it again") from exc

    def _analysis_module(self) -> None:
        """Compile es-analysis/ against this distribution's lib/ into modules/ANALYSIS_MODULE, once:
        the descriptor records the source's digest, and a changed source is compiled again."""
        shipped = files(__package__).joinpath(ANALYSIS_FILES)
        source = shipped.joinpath(ANALYSIS_SOURCE).read_bytes()
        template = shipped.joinpath("plugin-descriptor.properties").read_text(encoding="utf-8")
        digest = hashlib.sha256(source + template.encode()).hexdigest()
        module = self.dist / "modules" / ANALYSIS_MODULE
        descriptor = module / "plugin-descriptor.properties"
        stamp = f"# flowstat source sha256 {digest}\n"
        if descriptor.exists() and stamp in descriptor.read_text(encoding="utf-8"):
            return
        javac = Path(self.java_home(), "bin", "javac")
        if not javac.exists():
            found = [h for h in JAVA_HOMES if Path(h, "bin", "javac").exists()]
            if not found:
                raise StackError(
                    "elasticsearch: security needs a JDK's javac to compile its analysis module "
                    "(Debian: apt-get install openjdk-17-jdk-headless)"
                )
            javac = Path(found[0], "bin", "javac")
        # Built beside modules/ (never inside it: the node would load a half-made module), then
        # renamed into place in one step.
        with tempfile.TemporaryDirectory(dir=self.dist, prefix=".build-") as tmp:
            build = Path(tmp)
            (build / ANALYSIS_SOURCE).write_bytes(source)
            _run(
                f"compiling its {ANALYSIS_MODULE} module",
                [
                    str(javac),
                    "--release",
                    ANALYSIS_JAVA_RELEASE,
                    "-nowarn",
                    "-cp",
                    str(self.dist / "lib" / "*"),
                    "-d",
                    str(build / "classes"),
                    str(build / ANALYSIS_SOURCE),
                ],
            )
            made = build / ANALYSIS_MODULE
            made.mkdir()
            with zipfile.ZipFile(made / f"{ANALYSIS_MODULE}-{ES_VERSION}.jar", "w", zipfile.ZIP_DEFLATED) as jar:
                jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: flowstat\r\n\r\n")
                for cls in sorted((build / "classes").rglob("*.class")):
                    jar.write(cls, cls.relative_to(build / "classes").as_posix())
            (made / "plugin-descriptor.properties").write_text(
                stamp + template.format(name=ANALYSIS_MODULE, version=ES_VERSION, java_version=ANALYSIS_JAVA_RELEASE),
                encoding="utf-8",
            )
            for p in [made, *made.iterdir()]:
                p.chmod(0o755 if p.is_dir() else 0o644)
            if module.exists():
                module.rename(build / "old")
            made.rename(module)

    def _config(self) -> None:
        """A configuration folder of this node's own (its keystore and certificates live there)."""
        if (self.config_dir / "jvm.options").exists():
            return
        shutil.copytree(
            self.dist / "config",
            self.config_dir,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("elasticsearch.keystore"),
        )

    def _certificates(self) -> None:
        """A CA and the node's certificate (SAN IP:127.0.0.1, DNS:localhost), PEM, made once."""
        certs = self.config_dir / "certs"
        if all((certs / f).exists() for f in ("ca.crt", "http.crt", "http.key")):
            return
        openssl = shutil.which("openssl")
        if not openssl:
            raise StackError("elasticsearch: `openssl` is needed to make the TLS certificates (Debian: openssl)")
        certs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=certs, prefix=".make-") as tmp:
            t = Path(tmp)
            (t / "ca.cnf").write_text(
                "[req]\nprompt=no\ndistinguished_name=dn\nx509_extensions=ca\n"
                "[dn]\nCN=flowstat stack CA\n"
                "[ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\n"
            )
            (t / "http.ext").write_text(
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
            )
            for cmd in (
                [
                    openssl,
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    t / "ca.key",
                    "-out",
                    t / "ca.crt",
                    "-days",
                    "3650",
                    "-config",
                    t / "ca.cnf",
                ],
                [
                    openssl,
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    t / "http.key",
                    "-out",
                    t / "http.csr",
                    "-subj",
                    "/CN=localhost",
                ],
                [
                    openssl,
                    "x509",
                    "-req",
                    "-in",
                    t / "http.csr",
                    "-CA",
                    t / "ca.crt",
                    "-CAkey",
                    t / "ca.key",
                    "-CAcreateserial",
                    "-out",
                    t / "http.crt",
                    "-days",
                    "825",
                    "-sha256",
                    "-extfile",
                    t / "http.ext",
                ],
            ):
                _run("making the TLS certificates", [str(c) for c in cmd])
            (t / "http.key").chmod(0o600)
            for name in ("http.key", "http.crt", "ca.crt"):  # the CA's key is not kept: nothing signs again
                (t / name).replace(certs / name)

    def _plain_keystore(self) -> None:
        """The distribution's own (empty) keystore, made once at install: a node started without one
        makes it, and two nodes of one distribution starting at once collide on its temporary file."""
        if (self.config_dir / "elasticsearch.keystore").exists():
            return
        env = {**os.environ, "ES_PATH_CONF": str(self.config_dir), "ES_JAVA_HOME": self.java_home()}
        tool = str(self.dist / "bin" / "elasticsearch-keystore")
        _run("elasticsearch-keystore create", [tool, "create"], env=env, stdin=subprocess.DEVNULL)

    def _keystore(self) -> None:
        """bootstrap.password := ELASTIC_PASSWORD, through stdin (a command line is public). Set
        again only when the password changed: a salted digest of the one in the keystore is kept
        beside it (each run of the keystore tool starts a JVM)."""
        password = os.environ.get("ELASTIC_PASSWORD", "")
        if not password:
            raise StackError(
                "elasticsearch: security is on: set ELASTIC_PASSWORD in the environment "
                "(the password of the user elastic)"
            )
        keystore, stamp = self.config_dir / "elasticsearch.keystore", self.config_dir / ".bootstrap-password.digest"
        try:
            salt, kept = stamp.read_text().split(":")
            if keystore.exists() and _digest(password, bytes.fromhex(salt)) == kept:
                return
        except (OSError, ValueError):
            pass
        tool = str(self.dist / "bin" / "elasticsearch-keystore")
        env = {**os.environ, "ES_PATH_CONF": str(self.config_dir), "ES_JAVA_HOME": self.java_home()}
        stamp.unlink(missing_ok=True)
        keystore.unlink(missing_ok=True)  # made anew: the tool, as root, will not rewrite the service user's
        _run(  # -f makes the keystore too: one JVM, not two (create, then add)
            "elasticsearch-keystore add bootstrap.password",
            [tool, "add", "-f", "-x", "bootstrap.password"],
            env=env,
            input=password,
        )
        new_salt = os.urandom(16)
        stamp.touch(mode=0o600)
        stamp.write_text(f"{new_salt.hex()}:{_digest(password, new_salt)}")

    def java_home(self) -> str:
        for home in (os.environ.get("ES_JAVA_HOME"), *JAVA_HOMES):
            if home and Path(home, "bin", "java").exists():
                return home
        raise StackError("elasticsearch: no Java 17+ found (set ES_JAVA_HOME)")

    # -- run --------------------------------------------------------------------------------------
    def command(self):
        cmd = [
            str(self.dist / "bin" / "elasticsearch"),
            "-E",
            "discovery.type=single-node",
            "-E",
            f"http.port={self.port}",
            "-E",
            f"transport.port={self.transport_port}",
            "-E",
            "network.host=127.0.0.1",
            "-E",
            f"path.data={self.home / 'data'}",
            "-E",
            f"path.logs={self.home / 'logs'}",
            "-E",
            "cluster.routing.allocation.disk.threshold_enabled=false",
        ]
        # ES_JAVA_OPTS in the environment is honoured as Elasticsearch's own scripts honour it
        java_opts = self.extra.get("java_opts") or os.environ.get("ES_JAVA_OPTS") or "-Xms512m -Xmx512m"
        env = {"ES_JAVA_HOME": self.java_home(), "ES_JAVA_OPTS": java_opts, "ES_TMPDIR": str(self.tmp_dir)}
        if not any(c.isspace() for c in str(self.tmp_dir)):  # the launcher's script splits its options on spaces
            launcher = os.environ.get("CLI_JAVA_OPTS", "")
            env["CLI_JAVA_OPTS"] = f"{launcher} -Djava.io.tmpdir={self.tmp_dir}".strip()
        if not self.secured:
            return cmd + ["-E", "xpack.security.enabled=false"], env
        cmd += [
            "-E",
            "xpack.security.enabled=true",
            "-E",
            "xpack.security.transport.ssl.enabled=false",
            "-E",
            f"xpack.security.http.ssl.enabled={'true' if self.tls else 'false'}",
        ]
        if self.tls:  # relative to the configuration folder
            cmd += [
                "-E",
                "xpack.security.http.ssl.key=certs/http.key",
                "-E",
                "xpack.security.http.ssl.certificate=certs/http.crt",
                "-E",
                "xpack.security.http.ssl.certificate_authorities=certs/ca.crt",
            ]
        return cmd, {**env, "ES_PATH_CONF": str(self.config_dir)}

    def get(self, path: str, **kw) -> requests.Response:
        """As the user elastic when security is on, trusting the node's own CA."""
        if self.secured:
            kw.setdefault("auth", (ELASTIC_USER, os.environ.get("ELASTIC_PASSWORD", "")))
        if self.tls:
            kw.setdefault("verify", str(self.ca_file))
        return super().get(path, **kw)

    def healthy(self) -> bool:
        try:
            r = self.get("/_cluster/health")
            if not (r.status_code == 200 and r.json().get("status") in ("green", "yellow")):
                return False
            return not self.secured or self._security_index_ready()
        except (requests.RequestException, ValueError):
            return False

    def _security_index_ready(self) -> bool:
        """Native users log in only once the .security index answers (right after a start, a native
        user gets 401 "security index is not available"): absent (nothing written yet) or searchable."""
        r = self.get("/_security/user")
        return r.status_code == 200
