"""A local OpenSearch node (2.19.1 or 3.6.0), or a cluster of them, on loopback, assembled from
Maven Central artifacts.

Gives developers, CI and users without Docker a real node: `LocalNode.install` fetches the pinned
artifacts of its release with Maven, checks every file's SHA-256, and assembles a distribution once
(the integ-test zip plus, for 2.19.1, the lang-painless, analysis-common and reindex modules it
lacks, and the k-NN and neural-search plugins); `LocalNode.start|stop|status` run it with a
per-node config, data and log directory. A node keeps the release it was first started with.
OpenSearch refuses to run as root, so as root the node runs as the system user `hybridsearch`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape as xml_escape

from hybridsearch.config import get_settings
from hybridsearch.errors import ConfigError, EngineUnavailableError

Progress = Callable[[str], None]

SERVICE_USER = "hybridsearch"
JVM_DIR = Path("/usr/lib/jvm")
BOOTSTRAP_CLASS = "org.opensearch.bootstrap.OpenSearch"
STAMP_NAME = ".hybridsearch-stamp.json"
MVN_TIMEOUT_S = 1800  # one `mvn dependency:copy` of every artifact (about 200 MB the first time)


@dataclass(frozen=True)
class Pin:
    """One Maven artifact, its SHA-256, and its use: "distribution", "plugin" or "module:<name>"."""

    sha256: str
    coords: str  # groupId:artifactId:version[:type]
    use: str

    @property
    def group(self) -> str:
        return self.coords.split(":")[0]

    @property
    def artifact(self) -> str:
        return self.coords.split(":")[1]

    @property
    def version(self) -> str:
        return self.coords.split(":")[2]

    @property
    def type(self) -> str:
        parts = self.coords.split(":")
        return parts[3] if len(parts) > 3 else "jar"

    @property
    def filename(self) -> str:
        """The name `mvn dependency:copy` gives the file."""
        return f"{self.artifact}-{self.version}.{self.type}"


# Every file that goes into a 2.19.1 node, pinned by SHA-256 (some, like the neural-search zip, have no
# checksum on Maven Central). Plugins install in this order: k-NN extends lang-painless, neural-search
# extends k-NN.
PINS_2_19: tuple[Pin, ...] = (
    Pin("af7152d8b7f6f1cee09d47276b32b70479fe6dd8cdbb61213f84eb7f8098b261",
        "org.opensearch.distribution.integ-test-zip:opensearch:2.19.1:zip", "distribution"),
    Pin("eab8c9818865bc035212eab5068cdacae164baa09d4c152f49b736d6f6b0e85c",
        "org.opensearch.plugin:opensearch-knn:2.19.1.0:zip", "plugin"),
    Pin("b17ca1d774692902c58cbae102bf463970740c31d81446866e8eabd336e285aa",
        "org.opensearch.plugin:neural-search:2.19.1.0:zip", "plugin"),
    Pin("3cf5e02efa40ff5b88e74e1ab66a0bc462de3509fab4a6a4ffe90b8d13777a9a",
        "org.opensearch.plugin:lang-painless:2.19.1", "module:lang-painless"),
    Pin("c2598797a5f6f897ce7e8d05f593ff96de3fbc56c52f299d63cddcae41556dda",
        "org.opensearch.plugin:opensearch-scripting-painless-spi:2.19.1", "module:lang-painless"),
    Pin("54665d2838cc66458343468efc539e454fc95b46a8a04b13c6ac43fc9be63505",
        "org.antlr:antlr4-runtime:4.13.1", "module:lang-painless"),
    Pin("adf46d5e34940bdf148ecdd26a9ee8eea94496a72034ff7141066b3eea5c4e9d",
        "org.ow2.asm:asm:9.7", "module:lang-painless"),
    Pin("37a6414d36641973f1af104937c95d6d921b2ddb4d612c66c5a9f2b13fc14211",
        "org.ow2.asm:asm-util:9.7", "module:lang-painless"),
    Pin("62f4b3bc436045c1acb5c3ba2d8ec556ec3369093d7f5d06c747eb04b56d52b1",
        "org.ow2.asm:asm-tree:9.7", "module:lang-painless"),
    Pin("389bc247958e049fc9a0408d398c92c6d370c18035120395d4cba1d9d9304b7a",
        "org.ow2.asm:asm-commons:9.7", "module:lang-painless"),
    Pin("7bc6bcbc21379948a0c8c467fb0f864206e5b818f6bc0b546872f5c9f941556f",
        "org.ow2.asm:asm-analysis:9.7", "module:lang-painless"),
    Pin("13fdc1071af42946b13153a62491a5e9b0ad214d44f7c8153d3afef60f558821",
        "org.opensearch.plugin:analysis-common:2.19.1", "module:analysis-common"),
    Pin("eb2056ee54ac367f8820d5c13fa5cea2d10bb492b01f4d1a15a6dce163bf82ce",
        "org.opensearch.plugin:reindex-client:2.19.1", "module:reindex"),
    Pin("6ab691dc6cb2c12802bb9024df3379bd1779a2b626d3bd7b27ed5f974cbc1708",
        "org.opensearch.client:opensearch-rest-client:2.19.1", "module:reindex"),
    Pin("30fe6a20a08004044be90abdf0e711313b7dfe2e5c7b12ac32498ae8e1cae927",
        "org.opensearch:opensearch-ssl-config:2.19.1", "module:reindex"),
    Pin("c8bc7e1c51a6d4ce72f40d2ebbabf1c4b68bfe76e732104b04381b493478e9d6",
        "org.apache.httpcomponents:httpclient:4.5.14", "module:reindex"),
    Pin("6c9b3dd142a09dc468e23ad39aad6f75a0f2b85125104469f026e52a474e464f",
        "org.apache.httpcomponents:httpcore:4.4.16", "module:reindex"),
    Pin("0c1877489a9d1ba4fa50f6cfcab11d1123618858cb31d56afaab5afdd5064d99",
        "org.apache.httpcomponents:httpasyncclient:4.1.5", "module:reindex"),
    Pin("4018736ede2d321034e8517ea90baefb31831a8608afccc446d8a699fb1d00d4",
        "org.apache.httpcomponents:httpcore-nio:4.4.16", "module:reindex"),
    Pin("ec87bfb55f22cbd1b21e2190eeda28b2b312ed2a431ee49fbdcc01812d04a5e4",
        "commons-codec:commons-codec:1.16.1", "module:reindex"),
    Pin("daddea1ea0be0f56978ab3006b8ac92834afeefbd9b7e4e6316fca57df0fa636",
        "commons-logging:commons-logging:1.2", "module:reindex"),
)


@dataclass(frozen=True)
class Module:
    """A module the integ-test zip lacks: its plugin class and its security policy (empty: none)."""

    classname: str
    policy: str = ""


MODULES_2_19: dict[str, Module] = {
    "lang-painless": Module("org.opensearch.painless.PainlessPlugin",
                            'grant {\n  permission java.lang.RuntimePermission "createClassLoader";\n'
                            '  permission java.lang.RuntimePermission "getClassLoader";\n};\n'),
    "analysis-common": Module("org.opensearch.analysis.common.CommonAnalysisPlugin"),
    "reindex": Module("org.opensearch.index.reindex.ReindexPlugin",
                      'grant {\n  permission java.net.SocketPermission "*", "connect";\n};\n'),
}

# 3.6.0, the newest 3.x whose k-NN and neural-search plugins Maven Central serves; its integ-test zip
# carries the three modules itself; neither plugin zip has a checksum file there
PINS_3_6: tuple[Pin, ...] = (
    Pin("a91faa1dc1cadc78cb278b4f63847e19e1627a4e9de698e14e7efc14ee37b286",
        "org.opensearch.distribution.integ-test-zip:opensearch:3.6.0:zip", "distribution"),
    Pin("ac392ca28a39b3bf290648a422ef30cb149dda2963a9d7feb26060e932341c9a",
        "org.opensearch.plugin:opensearch-knn:3.6.0.0:zip", "plugin"),
    Pin("6ef1b206e79391e2e36268e32dc34d27fd8b8a59a8eb0a7393c97d53b038e433",
        "org.opensearch.plugin:neural-search:3.6.0.0:zip", "plugin"),
)


@dataclass(frozen=True)
class Release:
    """An OpenSearch release the launcher assembles: its pins, the modules it must add, and the Java
    versions it runs on (2.x needs the Security Manager, which Java 24 disabled for good; 3.x
    needs Java 21 or newer)."""

    version: str
    pins: tuple[Pin, ...]
    modules: tuple[tuple[str, Module], ...]
    min_java: int
    max_java: int | None  # None: no upper bound known
    preferred_java: tuple[int, ...]

    @property
    def java_range(self) -> str:
        return f"{self.min_java}..{self.max_java}" if self.max_java else f"{self.min_java} or newer"


RELEASES: dict[str, Release] = {
    "2.19.1": Release("2.19.1", PINS_2_19, tuple(MODULES_2_19.items()), 11, 21, (17, 21)),
    "3.6.0": Release("3.6.0", PINS_3_6, (), 21, None, (21, 25)),
}
def default_release() -> Release:
    """The release of a new node unless one is asked for: the setting opensearch_version."""
    return release_of(get_settings().opensearch_version)


def release_of(version: str) -> Release:
    """The release named `version`; ConfigError naming those there are."""
    try:
        return RELEASES[version]
    except KeyError:
        raise ConfigError(f"version: OpenSearch {version!r} is not one the launcher assembles; use one of "
                          f"{', '.join(RELEASES)}") from None


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def stderr_progress(message: str) -> None:
    """Progress printer for the CLI: one line to stderr."""
    print(message, file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- Java


@dataclass(frozen=True)
class JavaHome:
    """A JDK and its version, as `java -version` reports it."""

    path: Path
    major: int
    version: str


_VERSION_RE = re.compile(r'version "(?P<v>[^"]+)"')


def parse_java_version(text: str) -> tuple[int, str] | None:
    """(major, full version) from `java -version` output: "1.8.0_392" is 8, "17.0.15" is 17, "25-ea" is 25."""
    m = _VERSION_RE.search(text)
    if m is None:
        return None
    full = m.group("v")
    nums = re.match(r"(\d+)(?:\.(\d+))?", full)
    if nums is None:
        return None
    major = int(nums.group(1))
    if major == 1 and nums.group(2) is not None:
        major = int(nums.group(2))
    return major, full


@lru_cache(maxsize=64)
def _java_version_cached(java: str, mtime: float) -> tuple[int, str] | str:
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")}
    try:
        r = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`{java} -version` failed: {e}"
    parsed = parse_java_version(r.stderr + r.stdout)
    if parsed is None:
        return f"cannot parse `{java} -version`: {(r.stderr + r.stdout).strip()[:200]!r}"
    return parsed


def java_version(java_home: Path) -> tuple[int, str]:
    """(major, full version) of the JDK at java_home; EngineUnavailableError if it has no working bin/java."""
    java = java_home / "bin" / "java"
    if not (java.is_file() and os.access(java, os.X_OK)):
        raise EngineUnavailableError(f"{java_home} is not a JDK: no executable bin/java")
    out = _java_version_cached(str(java), java.stat().st_mtime)
    if isinstance(out, str):
        raise EngineUnavailableError(out)
    return out


def java_unsuitable_reason(major: int, release: Release | None = None) -> str | None:
    """Why the release (default: `default_release`) cannot run on this Java major version, or None if it can."""
    release = release or default_release()
    preferred = " or ".join(map(str, release.preferred_java))
    if release.max_java is not None and major >= 24 > release.max_java:
        return (f"Java {major} has no Security Manager (disabled for good in Java 24), which OpenSearch "
                f"{release.version} needs (use Java {release.java_range}, preferably {preferred}; or "
                f"--version {next(r.version for r in RELEASES.values() if r.max_java is None)}, which runs on "
                "it)")
    if major < release.min_java or (release.max_java is not None and major > release.max_java):
        return f"OpenSearch {release.version} supports Java {release.java_range} (preferably {preferred}), not {major}"
    return None


def _checked(java_home: Path, source: str, release: Release) -> JavaHome:
    """The JDK at java_home, or a clear error naming where it came from and why it does not fit."""
    try:
        major, full = java_version(java_home)
    except EngineUnavailableError as e:
        raise ConfigError(f"{source}={java_home}: {e}") from None
    reason = java_unsuitable_reason(major, release)
    if reason is not None:
        raise ConfigError(f"{source}={java_home} is Java {full}: {reason}")
    return JavaHome(java_home, major, full)


def choose_java_home(explicit: Path | None = None, jvm_dir: Path = JVM_DIR, release: Release | None = None
                     ) -> JavaHome:
    """The JDK to run the release (default: `default_release`) with, and why: an explicit one (argument,
    HYBRIDSEARCH_OPENSEARCH_JAVA_HOME or OPENSEARCH_JAVA_HOME) must fit; JAVA_HOME is used if it fits;
    else the best of jvm_dir/* (the release's preferred versions in order, then the newest that fits).
    Raises ConfigError naming what was found when nothing fits."""
    release = release or default_release()
    if explicit is None:
        explicit = get_settings().opensearch_java_home
    if explicit is not None:
        return _checked(Path(explicit), "opensearch_java_home", release)
    if os.environ.get("OPENSEARCH_JAVA_HOME"):
        return _checked(Path(os.environ["OPENSEARCH_JAVA_HOME"]), "OPENSEARCH_JAVA_HOME", release)
    found: list[str] = []
    candidates: list[tuple[Path, str]] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append((Path(os.environ["JAVA_HOME"]), "JAVA_HOME"))
    if jvm_dir.is_dir():
        candidates += [(p, str(p)) for p in sorted(jvm_dir.iterdir()) if p.is_dir()]
    on_path = shutil.which("java")
    if on_path:
        candidates.append((Path(on_path).resolve().parent.parent, "java on PATH"))
    usable: list[JavaHome] = []
    seen: set[Path] = set()
    for path, source in candidates:
        real = path.resolve()
        if real in seen or not (real / "bin" / "java").is_file():
            continue
        seen.add(real)
        try:
            major, full = java_version(path)
        except EngineUnavailableError as e:
            found.append(f"{source}: {e}")
            continue
        reason = java_unsuitable_reason(major, release)
        if reason is not None:
            found.append(f"{path} (Java {full}): {reason}")
            continue
        if source == "JAVA_HOME":
            return JavaHome(path, major, full)
        usable.append(JavaHome(real, major, full))
    if usable:
        ranks = release.preferred_java
        return min(usable, key=lambda j: (ranks.index(j.major), 0) if j.major in ranks else (len(ranks), -j.major))
    detail = "; ".join(found) if found else f"no JDK in {jvm_dir} and no java on PATH"
    raise ConfigError(f"no JDK {release.java_range} for OpenSearch {release.version} found ({detail}); "
                      f"install one (apt-get install -y openjdk-{release.preferred_java[0]}-jdk-headless) or set "
                      "HYBRIDSEARCH_OPENSEARCH_JAVA_HOME")


# ------------------------------------------------------------------------------------ processes, files


def running_as_root() -> bool:
    return os.geteuid() == 0


def default_home() -> Path:
    """Where the distribution and nodes live: Settings.opensearch_home, else a cache dir the service user can
    reach (as root /var/cache/hybridsearch/opensearch, since /root is mode 700)."""
    configured = get_settings().opensearch_home
    if configured is not None:
        return Path(configured).expanduser().resolve()
    if running_as_root():
        return Path("/var/cache/hybridsearch/opensearch")
    return Path.home() / ".cache" / "hybridsearch" / "opensearch"


def ensure_service_user() -> pwd.struct_passwd:
    """The system user the node runs as when we are root, created once."""
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    r = subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
                       capture_output=True, text=True)
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        raise EngineUnavailableError(
            f"OpenSearch refuses to run as root and the user {SERVICE_USER!r} could not be created "
            f"(useradd exit {r.returncode}: {(r.stderr or r.stdout).strip()})") from None


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


def _proc_state(pid: int) -> str | None:
    """The process state letter from /proc (None: no such process)."""
    return _proc_state_of(f"/proc/{pid}/stat")


def _proc_state_of(stat_path: str) -> str | None:
    try:
        data = Path(stat_path).read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return "?"
    return data.rsplit(")", 1)[1].split()[0]


def _proc_args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def process_exists(pid: int) -> bool:
    """True unless the process is gone: not alive by /proc (pid_alive), and not answering a signal 0
    either (/proc mounted with hidepid hides other users' processes, which still run)."""
    return pid_alive(pid) or (_signal_reaches(pid) and _proc_state(pid) not in ("Z", "X"))  # a zombie is gone


def _signal_reaches(pid: int) -> bool:
    """Whether signal 0 reaches the process (another user's too; a zombie too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie. A killed JVM's main thread turns zombie before its other
    threads are gone (and with them its sockets and files), so every thread must be a zombie."""
    if Path("/proc/self").exists():
        state = _proc_state(pid)
        if state is None:
            return False
        if state not in ("Z", "X"):
            return True
        try:
            tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir() if t.name.isdigit()]
        except OSError:
            return False
        return any(_proc_state_of(f"/proc/{pid}/task/{t}/stat") not in (None, "Z", "X") for t in tasks)
    return _signal_reaches(pid)


def _free_port(avoid: set[int] | None = None) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not avoid or port not in avoid:
            return port
    raise EngineUnavailableError("no free port on 127.0.0.1")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock so that two installs or two starts of the same node do not race."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 20, since: int = 0) -> str:
    """The last lines of a file, of what was written past byte `since`."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(since, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _version_at(url: str) -> str | None:
    """The OpenSearch version the node at url reports (None when it does not say)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(_http_json(url, 5)["version"]["number"])
    return None


@contextlib.contextmanager
def _signals_end_the_wait() -> Iterator[None]:
    """While a start waits for its node: SIGTERM and SIGHUP raise SystemExit (in the main thread),
    so that a `start` stopped by `timeout`, a CI cancel or a closed terminal stops the node it
    launched instead of leaving it running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    before = {sig: signal.signal(sig, end) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _http_json(url: str, timeout: float) -> Any:
    """GET url (no proxies: the node is on loopback) and decode the JSON answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def _health(url: str, timeout: float = 3.0, *, wait: bool = True) -> dict[str, Any] | None:
    """The cluster's health once the node answers (with `wait`, after waiting up to 1 s for
    yellow); None until it answers."""
    query = "?wait_for_status=yellow&timeout=1s" if wait else ""
    try:
        body = _http_json(f"{url}/_cluster/health{query}", timeout)
    except urllib.error.HTTPError as e:  # 408: not yellow within the second; the body is the health
        if e.code != 408:
            return None
        try:
            body = json.loads(e.read().decode())
        except (OSError, ValueError):
            return None
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


# the node attribute with which a node assembled here says that its k-NN plugin lacks the native
# (faiss, nmslib) libraries; `admin.check_native_knn` reads it
NATIVE_KNN_ATTR = "knn_native_libraries"

# how long a red cluster must have nothing left to recover before a start counts it as up
RED_SETTLE_S = 5.0


class _Ready:
    """Whether a node that answers is ready: its cluster yellow or green, or red with a shard
    unassigned and nothing left to recover (no shard initialising, relocating or delayed, no
    shard store being fetched, no task pending) for `settle` seconds. A primary shard with no copy
    to start from (its data gone), or with no node it may go to, stays red however long one waits,
    and the node must be up for the index to be restored or deleted."""

    def __init__(self, settle: float = RED_SETTLE_S) -> None:
        self.settle = settle
        self.red_since: float | None = None

    def __call__(self, url: str, timeout: float = 3.0) -> bool:
        h = _health(url, timeout)
        if h is not None and h.get("status") in ("green", "yellow"):
            return True
        busy = ("initializing_shards", "relocating_shards", "delayed_unassigned_shards", "number_of_in_flight_fetch",
                "number_of_pending_tasks")
        if h is None or h.get("status") != "red" or not h.get("unassigned_shards") or any(h.get(k) for k in busy):
            self.red_since = None
            return False
        now = time.monotonic()
        self.red_since = self.red_since or now
        return now - self.red_since >= self.settle


def red_indices(url: str, timeout: float = 5.0) -> list[str]:
    """The indices whose health is red (a primary shard unassigned), hidden ones included."""
    rows = _http_json(f"{url}/_cat/indices?health=red&h=index&format=json&expand_wildcards=all", timeout)
    return sorted(str(r["index"]) for r in rows)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` at once. The temporary file is unique to this writer: two processes that
    record the same node (a start, and a second start waiting for it) must not share one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the state holds no secret
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------- fetch, assemble


def _stamp(release: Release) -> dict[str, Any]:
    """What the assembled distribution was built from; a difference means reassemble."""
    return {
        "opensearch": release.version,
        "pins": [[p.coords, p.sha256, p.use] for p in release.pins],
        "modules": {name: [m.classname, m.policy] for name, m in release.modules},
    }


def fetch_artifacts(dest: Path, progress: Progress | None = None, release: Release | None = None) -> dict[Pin, Path]:
    """Every pinned artifact of the release (default: `default_release`) in dest, fetched with
    `mvn dependency:copy` where missing and checked by SHA-256. A file whose hash does not match is
    removed and named in the error with both hashes."""
    release = release or default_release()
    dest.mkdir(parents=True, exist_ok=True)
    pins = list(release.pins)
    missing = [p for p in pins if not ((dest / p.filename).is_file() and sha256_of(dest / p.filename) == p.sha256)]
    if missing:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise EngineUnavailableError(
                f"Maven (mvn) is needed to fetch OpenSearch {release.version} from Maven Central but is not on "
                "PATH; install it (apt-get install -y maven) and try again")
        with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp_name:
            tmp = Path(tmp_name)
            out = tmp / "out"
            items = "\n".join(
                f"<artifactItem><groupId>{xml_escape(p.group)}</groupId><artifactId>{xml_escape(p.artifact)}"
                f"</artifactId><version>{xml_escape(p.version)}</version><type>{xml_escape(p.type)}</type>"
                "</artifactItem>" for p in missing)
            # one Maven run for all artifacts (one `-Dartifact=` run each costs seconds of JVM start-up)
            (tmp / "pom.xml").write_text(
                '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
                "<groupId>local.hybridsearch</groupId><artifactId>opensearch-fetch</artifactId><version>0</version>"
                "<packaging>pom</packaging><build><plugins><plugin><groupId>org.apache.maven.plugins</groupId>"
                "<artifactId>maven-dependency-plugin</artifactId><configuration>"
                f"<outputDirectory>{xml_escape(str(out))}</outputDirectory><artifactItems>{items}</artifactItems>"
                "</configuration></plugin></plugins></build></project>\n")
            for p in missing:
                _say(progress, f"downloading {p.coords}")
            try:
                r = subprocess.run([mvn, "-q", "-B", "-f", str(tmp / "pom.xml"), "dependency:copy"], cwd=tmp,
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=MVN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise EngineUnavailableError(
                    f"mvn dependency:copy did not finish in {MVN_TIMEOUT_S} s fetching "
                    f"{', '.join(p.coords for p in missing)}; check the network to Maven Central and try again"
                ) from None
            if r.returncode != 0:
                tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-20:])
                raise EngineUnavailableError(f"mvn dependency:copy failed (exit {r.returncode}) fetching "
                                             f"{', '.join(p.coords for p in missing)}:\n{tail}")
            for p in missing:
                got = out / p.filename
                if not got.is_file():
                    raise EngineUnavailableError(f"mvn did not produce {p.filename} for {p.coords}")
                os.replace(got, dest / p.filename)
    files: dict[Pin, Path] = {}
    _say(progress, f"verifying the SHA-256 of {len(pins)} artifacts")
    for p in pins:
        path = dest / p.filename
        actual = sha256_of(path)
        if actual != p.sha256:
            path.unlink(missing_ok=True)
            m2 = Path.home() / ".m2" / "repository" / p.group.replace(".", "/") / p.artifact / p.version
            raise EngineUnavailableError(
                f"SHA-256 mismatch for {p.coords} ({p.filename}): expected {p.sha256}, got {actual}; the file was "
                f"removed (if the Maven cache holds a bad copy, delete {m2} and try again)")
        files[p] = path
    return files


def _extract_zip(archive: Path, dest: Path) -> None:
    """Unzip keeping the Unix permissions (zipfile drops them, and bin/ must stay executable)."""
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            target = Path(z.extract(info, dest))
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)


def _module_descriptor(name: str, module: Module, version: str) -> str:
    return (f"description={name} module\nversion={version}\nname={name}\nclassname={module.classname}\n"
            f"java.version=11\nopensearch.version={version}\ncustom.foldername=\nextended.plugins=\n"
            "has.native.controller=false\n")


def _run_tool(cmd: list[str], env: dict[str, str], what: str) -> None:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-20:])
        raise EngineUnavailableError(f"{what} failed (exit {r.returncode}):\n{tail}")


def _clean_env(java: JavaHome) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPENSEARCH_") and k not in ("JAVA_HOME", "JAVA_TOOL_OPTIONS", "JAVA_OPTS")}
    env["OPENSEARCH_JAVA_HOME"] = str(java.path)
    return env


def assemble(files: dict[Pin, Path], dest: Path, java: JavaHome, release: Release,
             progress: Progress | None = None) -> None:
    """Build the distribution in dest (which must not exist): unzip, add the modules, install the plugins."""
    (dist_zip,) = [f for p, f in files.items() if p.use == "distribution"]
    _say(progress, f"assembling OpenSearch {release.version} in {dest}")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".unzip-") as tmp:
        _extract_zip(dist_zip, Path(tmp))
        top = [p for p in Path(tmp).iterdir()]
        if len(top) != 1 or not (top[0] / "bin" / "opensearch").is_file():
            raise EngineUnavailableError(f"{dist_zip.name} does not hold one OpenSearch directory")
        os.replace(top[0], dest)
    for name, module in release.modules:
        _say(progress, f"adding module {name}")
        mdir = dest / "modules" / name
        mdir.mkdir(parents=True)
        for p, f in files.items():
            if p.use == f"module:{name}":
                shutil.copy2(f, mdir / f.name)
        (mdir / "plugin-descriptor.properties").write_text(_module_descriptor(name, module, release.version))
        if module.policy:
            (mdir / "plugin-security.policy").write_text(module.policy)
    env = _clean_env(java)
    env["OPENSEARCH_PATH_CONF"] = str(dest / "config")
    for p, f in files.items():
        if p.use == "plugin":
            _say(progress, f"installing plugin {p.artifact}")
            _run_tool([str(dest / "bin" / "opensearch-plugin"), "install", "--batch", f.resolve().as_uri()], env,
                      f"opensearch-plugin install {p.artifact}")


# ------------------------------------------------------------------------------------------- the node


@dataclass
class NodeStatus:
    """What `status` reports."""

    name: str
    running: bool
    answering: bool  # running, and its HTTP port answers (False while it starts, or when it hangs)
    url: str | None
    pid: int | None
    version: str | None
    java_home: str | None
    home: str
    node_dir: str
    installed: bool
    user: str | None
    health: str | None  # the cluster's: green, yellow or red; None when not running or not answering
    red_indices: list[str]  # when red: the indices with a primary shard unassigned
    # each node of the cluster: name, running, answering, pid, url (one, for a node alone)
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Launch:
    """A node's JVM being started: its launcher, URL, the state recorded for it, where this
    launch's lines begin in its log, and when it began."""

    launcher: subprocess.Popen[bytes]
    url: str
    state: dict[str, Any]
    log_since: int
    began: float


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEAP_RE = re.compile(r"^[1-9]\d*[kKmMgG]?$")


class LocalNode:
    """One named node under home: the shared distribution of its release in <home>/opensearch-<version>
    and the node's own config, data, logs, snapshots and state (node.json) in <home>/nodes/<name>.
    Its release is `version` if given, else the one its data was written by, else the setting
    opensearch_version; a node holding data of one release is never started as another."""

    def __init__(self, home: Path | str | None = None, name: str = "default", version: str | None = None) -> None:
        if not _NAME_RE.match(name):
            raise ConfigError(f"bad node name {name!r}: use letters, digits, '_', '.', '-'")
        self.home = (Path(home).expanduser().resolve() if home is not None else default_home())
        self.name = name
        self.asked = None if version is None else release_of(version)
        # the cluster this node starts in: its nodes' names and transport ports (LocalCluster sets
        # it); None: a single-node cluster
        self.peers: dict[str, int] | None = None
        self.shared_repo: Path | None = None  # the cluster's path.repo, which its nodes share (fs snapshots)

    @property
    def release(self) -> Release:
        if self.asked is not None:
            return self.asked
        held = self.recorded_release()
        return default_release() if held is None else release_of(held)

    def recorded_release(self) -> str | None:
        """The release whose data the node holds (None: a new node, or one whose data was deleted).
        Data from before releases were recorded is 2.19.1's, the only release then."""
        if not (self.data_dir.is_dir() and any(self.data_dir.iterdir())):
            return None
        with contextlib.suppress(OSError):
            return self.release_file.read_text().strip() or None
        return "2.19.1"

    def _check_release(self) -> None:
        """A node is started as the release its data was written by; another is refused."""
        held = self.recorded_release()
        if self.asked is not None and held not in (None, self.asked.version):
            raise ConfigError(f"version: node {self.name!r} holds data of OpenSearch {held} (in {self.data_dir}); "
                              f"start it with --version {held}, or choose another name for {self.asked.version}")

    # paths
    @property
    def dist_dir(self) -> Path:
        return self.home / f"opensearch-{self.release.version}"

    @property
    def downloads_dir(self) -> Path:
        return self.home / "downloads"

    @property
    def node_dir(self) -> Path:
        return self.home / "nodes" / self.name

    @property
    def data_dir(self) -> Path:
        return self.node_dir / "data"

    @property
    def logs_dir(self) -> Path:
        return self.node_dir / "logs"

    @property
    def config_dir(self) -> Path:
        return self.node_dir / "config"

    @property
    def snapshots_dir(self) -> Path:
        return self.node_dir / "snapshots"

    @property
    def state_file(self) -> Path:
        return self.node_dir / "node.json"

    @property
    def release_file(self) -> Path:
        """The version of the release that wrote the node's data (kept while the data is)."""
        return self.node_dir / "release"

    @property
    def pid_file(self) -> Path:
        return self.node_dir / "run" / "opensearch.pid"

    @property
    def log_file(self) -> Path:
        """The node's main log (log4j names it after cluster.name)."""
        return self.logs_dir / "hybridsearch.log"

    @property
    def launch_log(self) -> Path:
        """stdout and stderr of bin/opensearch (start-up errors before logging is set up land here)."""
        return self.logs_dir / "launch.log"

    # install
    def installed(self) -> bool:
        """True if the distribution is assembled from the current pins."""
        try:
            stamp = json.loads((self.dist_dir / STAMP_NAME).read_text())
        except (OSError, ValueError):
            return False
        return bool(stamp == _stamp(self.release) and (self.dist_dir / "bin" / "opensearch").is_file())

    def install(self, progress: Progress | None = None) -> Path:
        """Fetch, verify and assemble the distribution once (again only when a pin changed); returns its dir."""
        if self.installed():
            return self.dist_dir
        self._make_home()
        with _file_lock(self.home / ".install.lock"):
            if self.installed():
                return self.dist_dir
            busy = self._running_nodes()
            if busy:
                raise EngineUnavailableError(
                    f"the distribution in {self.dist_dir} must be reassembled but node(s) {', '.join(busy)} run from "
                    "it; stop them first (hybridsearch opensearch stop --name NAME)")
            # what an interrupted install left (a fetch or an assembly)
            for stale in [*self.home.glob(".assemble-*"), *self.downloads_dir.glob(".fetch-*")]:
                shutil.rmtree(stale, ignore_errors=True)
            release = self.release
            files = fetch_artifacts(self.downloads_dir, progress, release)
            java = choose_java_home(release=release)
            work = Path(tempfile.mkdtemp(dir=self.home, prefix=".assemble-"))
            try:
                new = work / self.dist_dir.name
                assemble(files, new, java, release, progress)
                (new / STAMP_NAME).write_text(json.dumps(_stamp(release), indent=1) + "\n")
                if running_as_root():
                    user = ensure_service_user()
                    _chown_tree(new, user.pw_uid, user.pw_gid)
                if self.dist_dir.exists():
                    os.replace(self.dist_dir, work / "old")
                os.replace(new, self.dist_dir)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            _say(progress, f"OpenSearch {release.version} assembled in {self.dist_dir}")
        return self.dist_dir

    def _make_home(self) -> None:
        for d in reversed([self.home, *self.home.parents]):
            if not d.exists():
                d.mkdir(mode=0o755)
                d.chmod(0o755)  # whatever the umask: the service user must get through

    def _running_nodes(self) -> list[str]:
        """The nodes of this release that run."""
        nodes = self.home / "nodes"
        if not nodes.is_dir():
            return []
        found = [LocalNode(self.home, d.name) for d in sorted(nodes.iterdir()) if d.is_dir() and _NAME_RE.match(d.name)]
        return [n.name for n in found if n.running_pid() is not None and n.dist_dir == self.dist_dir]

    # process
    def _read_state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _is_node_process(self, pid: int) -> bool:
        if not pid_alive(pid):
            return False
        if not Path("/proc/self").exists():
            return True
        args = _proc_args(pid)
        return BOOTSTRAP_CLASS in args and f"-Dopensearch.path.conf={self.config_dir}" in args

    def _scan_processes(self) -> list[int]:
        """Live OpenSearch processes that run with this node's config dir."""
        proc = Path("/proc")
        if not proc.is_dir():
            return []
        return [int(p.name) for p in proc.iterdir() if p.name.isdigit() and self._is_node_process(int(p.name))]

    def running_pid(self) -> int | None:
        """The pid of this node's OpenSearch process if it is alive (state file, pid file, then /proc)."""
        candidates: list[int] = []
        state_pid = self._read_state().get("pid")
        if isinstance(state_pid, int):
            candidates.append(state_pid)
        with contextlib.suppress(OSError, ValueError):
            candidates.append(int(self.pid_file.read_text().strip()))
        for pid in candidates:
            if self._is_node_process(pid):
                return pid
        found = self._scan_processes()
        return found[0] if found else None

    @property
    def pid(self) -> int | None:
        return self.running_pid()

    @property
    def url(self) -> str | None:
        """The URL of the running node (None when it is not running)."""
        url = self._read_state().get("url")
        return url if isinstance(url, str) and self.running_pid() is not None else None

    def is_running(self) -> bool:
        return self.running_pid() is not None

    def _wait_gone(self, pids: list[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(pid_alive(p) for p in pids):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as e:
            raise EngineUnavailableError(f"cannot signal OpenSearch pid {pid} of node {self.name!r}: {e}") from None

    # start
    def _choose_port(self, port: int | None, avoid: set[int], *, configured: bool = True) -> int:
        """`port`, else (with `configured`) the port the settings name, else the node's previous
        port while it is free, else a free one; never one in `avoid`."""
        if port is None and configured:
            port = get_settings().opensearch_port
        if port is not None:
            if not 1 <= port <= 65535:
                raise ConfigError(f"port: {port} is not a port from 1 to 65535")
            if not _port_free(port):
                raise EngineUnavailableError(f"port {port} on 127.0.0.1 is in use; pick another (--port, "
                                             "HYBRIDSEARCH_OPENSEARCH_PORT) or leave it unset for a free one")
            return port
        previous = self._read_state().get("port")  # keep the URL across restarts when we can
        if isinstance(previous, int) and previous not in avoid:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                if _port_free(previous):
                    return previous
                time.sleep(0.2)
        return _free_port(avoid)

    def _write_config(self, port: int, transport_port: int) -> None:
        src = self.dist_dir / "config"
        for entry in src.iterdir():
            if entry.name in ("opensearch.yml", "opensearch.keystore"):
                continue
            target = self.config_dir / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target, dirs_exist_ok=True)
            else:
                shutil.copy2(entry, target)
        # jvm.options writes heap dumps, fatal error logs and gc logs relative to the distribution: point them here
        jvm = (src / "jvm.options").read_text()
        jvm = jvm.replace("-XX:HeapDumpPath=data", f"-XX:HeapDumpPath={self.logs_dir}")
        jvm = jvm.replace("=logs/", f"={self.logs_dir}/")
        (self.config_dir / "jvm.options").write_text(jvm)

        def q(value: object) -> str:
            return json.dumps(str(value))

        (self.config_dir / "opensearch.yml").write_text(
            "# written by hybridsearch (hybridsearch/engines/opensearch/node.py) at each start\n"
            f"cluster.name: hybridsearch\nnode.name: {q(self.name)}\n{self._discovery()}"
            f"network.host: 127.0.0.1\nhttp.port: {port}\ntransport.port: {transport_port}\n"
            "cluster.routing.allocation.disk.threshold_enabled: false\n"
            # the bm25 channel sends one term clause per (field, query term): 8 fields x 128 terms
            # already reach OpenSearch's default limit of 1024 clauses
            "indices.query.bool.max_clause_count: 65536\n"
            # the k-NN zip on Maven Central has no native libraries: a faiss field would kill the
            # node at its first refresh, so the node says so and hybridsearch refuses to map one
            f"node.attr.{NATIVE_KNN_ATTR}: absent\n"
            f"path.data: {q(self.data_dir)}\npath.logs: {q(self.logs_dir)}\n"
            f"path.repo: {q(self.shared_repo or self.snapshots_dir)}\n")

    def _discovery(self) -> str:
        """The config's discovery lines: a single-node cluster, or one of `peers` (found by their
        transport ports; the first start of them all elects a cluster manager among them)."""
        if not self.peers:
            return "discovery.type: single-node\n"
        seeds = json.dumps([f"127.0.0.1:{p}" for p in self.peers.values()])
        return f"discovery.seed_hosts: {seeds}\ncluster.initial_cluster_manager_nodes: {json.dumps(list(self.peers))}\n"

    def _check_reachable(self) -> None:
        """As root the node runs as the service user: it must be able to get to home."""
        if shutil.which("runuser") is None:
            raise EngineUnavailableError("OpenSearch refuses to run as root and `runuser` (util-linux), which runs it "
                                         f"as the user {SERVICE_USER!r}, is not on PATH")
        r = subprocess.run(["runuser", "-u", SERVICE_USER, "--", "test", "-x", str(self.home)],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return
        blocker = next((str(d) for d in reversed([self.home, *self.home.parents])
                        if d.exists() and not d.stat().st_mode & stat.S_IXOTH), None)
        why = f"{blocker} is not searchable by others (mode {stat.filemode(Path(blocker).stat().st_mode)})" \
            if blocker else (r.stderr.strip() or "test -x failed")
        raise ConfigError(f"the OpenSearch service user {SERVICE_USER!r} cannot reach {self.home}: {why}; choose a "
                          "home it can reach (--home, HYBRIDSEARCH_OPENSEARCH_HOME), e.g. "
                          "/var/cache/hybridsearch/opensearch")

    def _prepare_dirs(self) -> pwd.struct_passwd | None:
        self.node_dir.mkdir(parents=True, exist_ok=True)
        for d in (self.home / "nodes", self.node_dir):
            d.chmod(0o755)
        dirs = [self.data_dir, self.logs_dir, self.snapshots_dir, self.config_dir, self.node_dir / "tmp",
                self.pid_file.parent]
        for d in dirs:
            d.mkdir(exist_ok=True)
        if not running_as_root():
            return None
        user = ensure_service_user()
        for d in dirs:
            _chown_tree(d, user.pw_uid, user.pw_gid)
        if self.dist_dir.stat().st_uid != user.pw_uid:
            _chown_tree(self.dist_dir, user.pw_uid, user.pw_gid)
        return user

    def _failure(self, what: str, launch_rc: int | None = None, log_since: int = 0) -> EngineUnavailableError:
        """An error with the last lines of the node's log (of what this launch wrote, past byte
        `log_since`) and of its launcher's output."""
        parts = [what]
        if launch_rc is not None:
            parts[0] += f" (bin/opensearch exited {launch_rc})"
        for path, since in ((self.log_file, log_since), (self.launch_log, 0)):
            tail = _tail(path, since=since)
            parts.append(f"--- last lines of {path} ---\n{tail}" if tail else f"--- {path}: empty or missing ---")
        return EngineUnavailableError("\n".join(parts))

    def _write_state(self, state: dict[str, Any]) -> None:
        _write_json(self.state_file, state)

    def _forget(self) -> None:
        """The node is gone: keep only its ports (and its cluster's node names) in the state file,
        for the next start to reuse."""
        state = self._read_state()
        kept: dict[str, Any] = {k: state[k] for k in ("name", "port", "transport_port", "cluster") if k in state}
        if "port" in kept:
            self._write_state(kept)
        else:
            self.state_file.unlink(missing_ok=True)

    def _kill_launch(self, launcher: subprocess.Popen[bytes]) -> None:
        """Stop everything a failed start left: the launcher's process group and the node's JVM."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(launcher.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=10)
        pids = self._scan_processes()
        for pid in pids:
            with contextlib.suppress(EngineUnavailableError):
                self._signal(pid, signal.SIGKILL)
        self._wait_gone(pids, 10)
        self.pid_file.unlink(missing_ok=True)
        self.state_file.unlink(missing_ok=True)

    def start(self, port: int | None = None, timeout: float | None = None,
              progress: Progress | None = None) -> str:
        """Start the node (installing first if needed) and return its URL once the cluster is yellow
        or green, or red with nothing left to recover (see `_Ready`; `red_indices` names them). If it
        already runs and answers, return its URL. timeout covers the launch, not the install."""
        timeout, heap = self._start_checks(timeout)
        cluster = self._read_state().get("cluster")
        if self.peers is None and isinstance(cluster, list) and len(cluster) > 1:
            # alone it would start as a single-node cluster over a cluster's data
            raise _not_alone(self.name, str(cluster[0]))
        self._check_release()
        existing = self._already_running(timeout)
        if existing is not None:
            return existing
        java = choose_java_home(release=self.release)
        self.install(progress)
        with _file_lock(self.node_dir / ".start.lock"):
            existing = self._already_running(timeout)
            if existing is not None:
                return existing
            return self._launch(port, timeout, heap, java, progress)

    def _start_checks(self, timeout: float | None) -> tuple[float, str]:
        """What every start checks first; returns (the timeout, the heap)."""
        settings = get_settings()
        timeout = settings.opensearch_start_timeout if timeout is None else timeout
        if not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"timeout: {timeout} is not a number of seconds above 0")
        heap = settings.opensearch_heap
        if not _HEAP_RE.match(heap):
            raise ConfigError(f"opensearch_heap {heap!r} is not a JVM size like 512m or 1g")
        if any(c.isspace() for c in str(self.home)):
            # bin/opensearch splits OPENSEARCH_JAVA_OPTS, which carries the node's tmp dir, on whitespace
            raise ConfigError(f"OpenSearch home {str(self.home)!r} holds whitespace, which the node's launcher "
                              "cannot pass to Java; choose another (--home, HYBRIDSEARCH_OPENSEARCH_HOME)")
        self._make_home()
        if running_as_root():
            ensure_service_user()
            self._check_reachable()
        return timeout, heap

    def _already_running(self, timeout: float) -> str | None:
        pid = self.running_pid()
        if pid is None:
            return None
        url = self._read_state().get("url")
        if not isinstance(url, str):
            raise EngineUnavailableError(f"node {self.name!r} runs (pid {pid}) but {self.state_file} has no URL; "
                                         "stop it first (hybridsearch opensearch stop)")
        deadline = time.monotonic() + timeout
        ready = _Ready(settle=0.0)  # a node that already runs: a red cluster is as it is
        while not ready(url):
            if time.monotonic() > deadline or not pid_alive(pid):
                raise self._failure(f"node {self.name!r} runs (pid {pid}) but {url} does not answer; "
                                    "stop it (hybridsearch opensearch stop) and start it again")
            time.sleep(0.25)
        state = self._read_state()
        if state.pop("starting", False) and state.get("url") == url:  # its start was killed, or is finishing
            self._write_state({**state, "pid": pid, "version": _version_at(url), "started_at": time.time()})
        return url

    def _launch(self, port: int | None, timeout: float, heap: str, java: JavaHome, progress: Progress | None) -> str:
        launch = self._spawn(*self._ports(port, set()), heap, java, progress)
        return self._await(launch, timeout, progress)

    def _ports(self, port: int | None, avoid: set[int], *, configured: bool = True) -> tuple[int, int]:
        """(HTTP, transport) ports for a start (the HTTP port as `_choose_port` picks it; the
        previous transport port while it is free, else a free one); none in `avoid` (those chosen
        for other nodes starting with this one)."""
        http_port = self._choose_port(port, avoid, configured=configured)
        previous = self._read_state().get("transport_port")
        taken = avoid | {http_port}
        if isinstance(previous, int) and previous not in taken and _port_free(previous):
            return http_port, previous
        return http_port, _free_port(taken)

    def _spawn(self, http_port: int, transport_port: int, heap: str, java: JavaHome,
               progress: Progress | None) -> _Launch:
        """Write the config and start the JVM (bin/opensearch -d); `_await` waits for it."""
        user = self._prepare_dirs()
        self.release_file.write_text(self.release.version + "\n")
        self._write_config(http_port, transport_port)
        if user is not None:
            _chown_tree(self.config_dir, user.pw_uid, user.pw_gid)
        self.pid_file.unlink(missing_ok=True)
        url = f"http://127.0.0.1:{http_port}"
        # written before the JVM exists: a second `start`, or one after this process was killed,
        # finds the URL to wait on (and then completes this record)
        state: dict[str, Any] = {
            "name": self.name, "url": url, "port": http_port, "transport_port": transport_port,
            "java_home": str(java.path), "java_version": java.version, "heap": heap,
            "user": SERVICE_USER if user is not None else _user_name(), "home": str(self.home), "starting": True}
        if self.peers:
            state["cluster"] = list(self.peers)
        self._write_state(state)
        log_since = _size(self.log_file)
        env = _clean_env(java)
        env.update(OPENSEARCH_PATH_CONF=str(self.config_dir), OPENSEARCH_JAVA_OPTS=f"-Xms{heap} -Xmx{heap}",
                   OPENSEARCH_TMPDIR=str(self.node_dir / "tmp"))
        cmd = [str(self.dist_dir / "bin" / "opensearch"), "-d", "-p", str(self.pid_file)]
        if user is not None:
            cmd = ["runuser", "-u", SERVICE_USER, "--", *cmd]
        _say(progress, f"starting OpenSearch node {self.name!r} on {url} (Java {java.version}, heap {heap})")
        began = time.monotonic()
        with self.launch_log.open("wb") as out:
            launcher = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, cwd=self.dist_dir, start_new_session=True)
        return _Launch(launcher, url, state, log_since, began)

    def _await(self, launch: _Launch, timeout: float, progress: Progress | None) -> str:
        """Wait until the node `_spawn` started answers (see `_wait_ready`), record it and return
        its URL; a node that fails is killed with its launcher."""
        url, state = launch.url, launch.state
        try:
            with _signals_end_the_wait():
                self._wait_ready(launch.launcher, url, timeout, launch.began + timeout, launch.log_since)
        except BaseException:
            self._kill_launch(launch.launcher)
            raise
        with contextlib.suppress(subprocess.TimeoutExpired):
            launch.launcher.wait(timeout=10)
        del state["starting"]
        pid = self.running_pid()
        self._write_state({**state, "pid": pid, "version": _version_at(url), "started_at": time.time()})
        _say(progress, f"OpenSearch node {self.name!r} (pid {pid}) answers at {url} after "
                       f"{time.monotonic() - launch.began:.1f} s")
        return url

    def _wait_ready(self, launcher: subprocess.Popen[bytes], url: str, timeout: float, deadline: float,
                    log_since: int) -> None:
        """Until the node answers at url (see `_Ready`); raises, with the logs' last lines, when it
        dies or the deadline passes."""
        pid: int | None = None
        seen: int | None = None
        launcher_done: float | None = None
        ready = _Ready()
        while True:
            rc = launcher.poll()
            if rc not in (None, 0):
                raise self._failure(f"OpenSearch node {self.name!r} failed to start", rc, log_since)
            if pid is None or not self._is_node_process(pid):
                pid = self.running_pid()
            seen = pid or seen
            if pid is None and rc == 0:
                # the launcher forked the JVM and left: a JVM that was seen and is gone, or never shows up, died
                launcher_done = launcher_done or time.monotonic()
                if seen is not None or time.monotonic() - launcher_done > 3.0:
                    raise self._failure(f"OpenSearch node {self.name!r} exited during start-up", None, log_since)
            remaining = deadline - time.monotonic()
            if pid is not None and remaining > 0 and ready(url, timeout=min(3.0, max(remaining, 0.1))):
                return
            if time.monotonic() >= deadline:
                raise self._failure(f"OpenSearch node {self.name!r} did not answer at {url} within {timeout:g} s "
                                    "(raise --timeout or HYBRIDSEARCH_OPENSEARCH_START_TIMEOUT); stopped it", None,
                                    log_since)
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    # stop, kill, status
    def stop(self, timeout: float = 30.0) -> int | None:
        """Stop the node (SIGTERM, then SIGKILL after timeout s); returns the pid it stopped, None if not running."""
        pid = self.running_pid()
        if pid is None:
            self._forget()
            return None
        self._signal(pid, signal.SIGTERM)
        if not self._wait_gone([pid], timeout):
            self._signal(pid, signal.SIGKILL)
            if not self._wait_gone([pid], 10):
                raise EngineUnavailableError(f"OpenSearch pid {pid} of node {self.name!r} survived SIGKILL")
        self._forget()
        self.pid_file.unlink(missing_ok=True)
        return pid

    def kill(self) -> int | None:
        """SIGKILL the node and clean nothing up (state file, locks stay): for crash tests. Waits until it is gone."""
        pid = self.running_pid()
        if pid is None:
            return None
        self._signal(pid, signal.SIGKILL)
        self._wait_gone([pid], 10)
        return pid

    def status(self) -> NodeStatus:
        """Whether the node runs, and where, with which Java and version."""
        state = self._read_state()
        pid = self.running_pid()
        url = state.get("url") if pid is not None else None
        version: str | None = None
        health: str | None = None
        red: list[str] = []
        if url:
            version = _version_at(url)
            health = (_health(url, wait=False) or {}).get("status")
            if health == "red":
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    red = red_indices(url)
        java_home = state.get("java_home") if pid is not None else None
        if java_home is None:
            with contextlib.suppress(ConfigError, EngineUnavailableError):
                java_home = str(choose_java_home(release=self.release).path)
        return NodeStatus(name=self.name, running=pid is not None, answering=version is not None, url=url, pid=pid,
                          version=version,
                          java_home=java_home, home=str(self.home), node_dir=str(self.node_dir),
                          installed=self.installed(), user=state.get("user") if pid is not None else None,
                          health=health, red_indices=red,
                          nodes=[{"name": self.name, "running": pid is not None, "answering": version is not None,
                                  "pid": pid, "url": url}])


MAX_CLUSTER_NODES = 9


def _not_alone(node: str, cluster: str) -> ConfigError:
    """The error of a start of one node of a cluster on its own."""
    return ConfigError(f"node {node!r} is a node of the cluster {cluster!r}; start the cluster: "
                       f"hybridsearch opensearch start --name {cluster}")


class LocalCluster:
    """Local nodes on loopback forming one cluster, each a LocalNode with its own config, data,
    logs and ports: the first is named NAME, the others NAME.2 … NAME.<n>, and the record
    <home>/nodes/NAME/cluster.json lists them. Without a record NAME is a node alone (discovery
    type single-node), which every method passes to LocalNode as it is."""

    def __init__(self, home: Path | str | None = None, name: str = "default", version: str | None = None) -> None:
        self.first = LocalNode(home, name, version)
        self.home, self.name, self.version = self.first.home, name, version

    @property
    def record_file(self) -> Path:
        return self.first.node_dir / "cluster.json"

    def names(self) -> list[str]:
        """The cluster's node names, from its record (or, without one, from what the node NAME
        recorded of its cluster); [NAME] for a node alone."""
        try:
            data = json.loads(self.record_file.read_text())
        except (OSError, ValueError):
            data = {"nodes": self.first._read_state().get("cluster")}
        names = data.get("nodes") if isinstance(data, dict) else None
        return [str(n) for n in names] if isinstance(names, list) and names else [self.name]

    def nodes(self) -> list[LocalNode]:
        return [LocalNode(self.home, n, self.version) for n in self.names()]

    def start(self, size: int | None = None, port: int | None = None, timeout: float | None = None,
              progress: Progress | None = None) -> str:
        """Start the cluster's nodes that do not run (all of them the first time: `size`, default
        1), all at once, and return the first answering node's URL once every node has joined and
        the cluster is yellow or green. A cluster keeps its size: another `size` is refused."""
        names = self.names()
        if names[0] != self.name:
            raise _not_alone(self.name, names[0])
        if size is not None and not 1 <= size <= MAX_CLUSTER_NODES:
            raise ConfigError(f"nodes: {size} is not a node count from 1 to {MAX_CLUSTER_NODES}")
        if len(names) > 1 and size not in (None, len(names)):
            raise ConfigError(f"nodes: {self.name!r} is a cluster of {len(names)} nodes; start it with --nodes "
                              f"{len(names)}, or stop it and choose another name for a cluster of {size}")
        if len(names) == 1 and (size or 1) == 1:
            return self.first.start(port, timeout, progress)
        if len(names) == 1:
            names = self._new_record(size or 1)
        # every node runs the first one's release (a node added to a cluster takes it too)
        return self._start_nodes([LocalNode(self.home, n, self.version or self.first.release.version) for n in names],
                                 port, timeout, progress)

    def _new_record(self, size: int) -> list[str]:
        """Record a new cluster of `size` nodes; refused where a node of that name holds data."""
        names = [self.name, *(f"{self.name}.{i}" for i in range(2, size + 1))]
        for n in names:
            node = LocalNode(self.home, n)
            if node.is_running() or (node.data_dir.is_dir() and any(node.data_dir.iterdir())):
                raise ConfigError(f"nodes: node {n!r} already holds a single-node cluster (in {node.node_dir}); "
                                  f"choose another name for a cluster of {size}, or delete that directory")
        self.first.node_dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.record_file, {"nodes": names})
        return names

    def _start_nodes(self, nodes: list[LocalNode], port: int | None, timeout: float | None,
                     progress: Progress | None) -> str:
        timeout, heap = self.first._start_checks(timeout)
        for node in nodes:
            node._check_release()
        java = choose_java_home(release=nodes[0].release)
        nodes[0].install(progress)
        deadline = time.monotonic() + timeout
        with contextlib.ExitStack() as stack:
            for node in nodes:
                stack.enter_context(_file_lock(node.node_dir / ".start.lock"))
            down = [node for node in nodes if node.running_pid() is None]
            # every node's ports are chosen before any config is written (each config names them
            # all), each node's previous ones kept from the others
            states = {n.name: n._read_state() for n in nodes}
            previous = {name: {p for k in ("port", "transport_port") if isinstance(p := st.get(k), int)}
                        for name, st in states.items()}
            ports: dict[str, tuple[int, int]] = {}
            for i, node in enumerate(nodes):
                state = states[node.name]
                if node in down:
                    others = {p for n, ps in previous.items() if n != node.name for p in ps}
                    ports[node.name] = node._ports(port if i == 0 else None,
                                                   others | {p for ps in ports.values() for p in ps}, configured=i == 0)
                elif isinstance(state.get("port"), int) and isinstance(state.get("transport_port"), int):
                    ports[node.name] = (state["port"], state["transport_port"])
                else:
                    raise EngineUnavailableError(f"node {node.name!r} runs but {node.state_file} lacks its ports; "
                                                 f"stop the cluster (hybridsearch opensearch stop --name {self.name}) "
                                                 "and start it again")
            peers = {n.name: ports[n.name][1] for n in nodes}
            launches: list[tuple[LocalNode, _Launch]] = []
            try:
                with _signals_end_the_wait():
                    for node in down:
                        node.peers, node.shared_repo = peers, self.first.snapshots_dir
                        launches.append((node, node._spawn(*ports[node.name], heap, java, progress)))
                    for node, launch in launches:
                        node._await(launch, max(deadline - launch.began, 0.1), progress)
                    url = self._wait_joined(nodes, deadline)
            except BaseException:
                for node, launch in launches:
                    node._kill_launch(launch.launcher)
                raise
        if down:
            urls = ",".join(str(n._read_state().get("url")) for n in nodes)
            started = ", ".join(n.name for n in down)
            _say(progress, f"OpenSearch cluster {self.name!r}: all {len(nodes)} nodes joined ({started} started); "
                           f"a client that knows them all: HYBRIDSEARCH_OPENSEARCH_URL={urls}")
        return url

    def _wait_joined(self, nodes: list[LocalNode], deadline: float) -> str:
        """Until the cluster counts all `nodes`; returns the first answering node's URL."""
        while True:
            for node in nodes:
                url = node._read_state().get("url")
                if not isinstance(url, str):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    h = _http_json(f"{url}/_cluster/health?wait_for_nodes={len(nodes)}&timeout=2s", 5.0)
                    if h.get("number_of_nodes") == len(nodes):
                        return url
            if time.monotonic() >= deadline:
                raise EngineUnavailableError(
                    f"OpenSearch cluster {self.name!r}: not all of its {len(nodes)} nodes joined in time; their logs "
                    f"are in {', '.join(str(n.logs_dir) for n in nodes)}")
            time.sleep(0.5)

    def stop(self, timeout: float = 30.0) -> list[tuple[str, int | None]]:
        """Stop every node at once; returns (name, pid stopped or None) for each."""
        nodes = self.nodes()
        with ThreadPoolExecutor(len(nodes)) as pool:
            pids = list(pool.map(lambda n: n.stop(timeout), nodes))
        return [(n.name, pid) for n, pid in zip(nodes, pids, strict=True)]

    def status(self) -> NodeStatus:
        """The first answering node's status (else the first node's), named after the cluster,
        with every node in `nodes`."""
        statuses = [n.status() for n in self.nodes()]
        if len(statuses) == 1:
            return statuses[0]
        top = next((st for st in statuses if st.answering), statuses[0])
        return replace(top, name=self.name, running=any(st.running for st in statuses),
                       nodes=[row for st in statuses for row in st.nodes])
