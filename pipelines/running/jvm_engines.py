"""Flink's and Spark's Beam job servers, built from the runner jars Maven Central serves.

Beam publishes each job server twice: as a shaded ``...-job-server`` jar (what Beam's
Python runner would download at run time) and inside the plain runner jar
(``org.apache.beam:beam-runners-flink-<X.Y>``, ``beam-runners-spark-3``), whose
``FlinkJobServerDriver`` / ``SparkJobServerDriver`` is the same program. The registries
this machine kind reaches serve only the plain jars (and ``beam-runners-java-job-service``
only up to 2.65.0, while the 2.70 runners ask for 2.70.0 of it: pinned), so a fetch

1. writes a small ``pom.xml`` naming the runner jar and the pins (:func:`pom_xml`),
2. has Maven copy it and its runtime dependencies into ``<engine>-lib/`` (``-C``: a
   download whose checksum differs from the registry's fails),
3. writes a jar holding only a manifest (``Main-Class`` the driver, ``Class-Path`` every
   copied jar, and the ``Add-Opens`` Java 17 needs for Spark's and Flink's reflection),
   which ``java -jar`` starts like the shaded jar and Beam's ``--flink_job_server_jar`` /
   ``--spark_job_server_jar`` accept,
4. records the versions and the sha256 of every jar in ``<engine>.json`` (written last:
   a half fetch leaves no record); every later use re-hashes them all.

The Job API between the Python SDK and the job server is a protobuf service that Beam
keeps compatible across these releases: the SDK 2.77.0 released byte-identical outputs
on the 2.70.0 runners (``thresher engines check``).
"""
import dataclasses
import os
import shutil
import zipfile

# The newest runner jar the registry serves per engine (Flink 1.19 is the only Flink
# whose Beam runner jar is served: 2.62.0 and 2.70.0). ``PINS`` fixes transitive
# versions that are not served.
SERVED = {
    "flink-1.19": ("org.apache.beam", "beam-runners-flink-1.19", ("2.70.0",),
                   "org.apache.beam.runners.flink.FlinkJobServerDriver"),
    "spark-3": ("org.apache.beam", "beam-runners-spark-3", ("2.70.0",),
                "org.apache.beam.runners.spark.SparkJobServerDriver"),
}
PINS = {"2.70.0": {"org.apache.beam:beam-runners-java-job-service": "2.65.0"}}
FLINK_VERSIONS = tuple(name.split("-", 1)[1] for name in SERVED if name.startswith("flink-"))

# Java 17 refuses reflective access into these packages unless opened; Spark 3.5 and
# Flink 1.19 need them (the list Spark's own launcher passes, plus java.util.concurrent.*).
ADD_OPENS = ("java.base/java.lang java.base/java.lang.invoke java.base/java.lang.reflect "
             "java.base/java.io java.base/java.net java.base/java.nio java.base/java.util "
             "java.base/java.util.concurrent java.base/java.util.concurrent.atomic "
             "java.base/sun.nio.ch java.base/sun.nio.cs java.base/sun.security.action "
             "java.base/sun.util.calendar java.base/java.text java.base/java.time")

# Spark 3.5 declares its own classes `provided` in Beam's pom: named here so the
# classpath is complete (the versions Beam 2.70's Spark runner is built against).
SPARK_EXTRA = (("org.apache.spark", "spark-core_2.12", "3.5.0"),
               ("org.apache.spark", "spark-streaming_2.12", "3.5.0"))


@dataclasses.dataclass(frozen=True)
class JvmEngine:
    name: str            # flink-1.19, spark-3
    group: str
    artifact: str
    version: str         # the runner jar's Beam version
    main_class: str

    @property
    def coordinates(self):
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def lib(self):
        return f"{self.name}-lib"

    @property
    def jar_name(self):
        return f"{self.artifact}-job-server-{self.version}-thresher.jar"

    @property
    def pins(self):
        return dict(PINS.get(self.version, {}))

    def source(self):
        pins = "".join(f" ({key} pinned to {value})" for key, value in self.pins.items())
        return self.coordinates + pins


def candidates(name):
    """The served runner jars of ``name`` (flink-1.19, spark-3), the fetched one first."""
    group, artifact, versions, main = SERVED[name]
    return [JvmEngine(name, group, artifact, version, main) for version in versions]


def pom_xml(eng):
    """The pom whose runtime dependencies are the job server's classpath."""
    managed = "".join(
        f"<dependency><groupId>{key.split(':')[0]}</groupId><artifactId>{key.split(':')[1]}"
        f"</artifactId><version>{value}</version></dependency>\n"
        for key, value in eng.pins.items())
    extra = SPARK_EXTRA if eng.name.startswith("spark") else ()
    deps = [(eng.group, eng.artifact, eng.version)] + list(extra)
    listed = "".join(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                     f"<version>{v}</version></dependency>\n" for g, a, v in deps)
    return ("<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n"
            "<modelVersion>4.0.0</modelVersion>\n<groupId>thresher.engines</groupId>\n"
            f"<artifactId>{eng.name}-job-server</artifactId><version>1</version>\n"
            "<packaging>pom</packaging>\n"
            f"<dependencyManagement><dependencies>\n{managed}</dependencies>"
            "</dependencyManagement>\n"
            f"<dependencies>\n{listed}</dependencies>\n</project>\n")


def maven_command(pom_folder, lib_folder):
    return ["mvn", "-B", "-C", "--no-transfer-progress", "-Dstyle.color=never",
            "-f", os.path.join(pom_folder, "pom.xml"),
            "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies",
            f"-DoutputDirectory={lib_folder}", "-DincludeScope=runtime"]


def _manifest_lines(name, value):
    """One manifest attribute, wrapped at 72 bytes as the JAR spec requires."""
    text = f"{name}: {value}".encode()
    lines, first = [], True
    while text:
        size = 72 if first else 71
        lines.append((b"" if first else b" ") + text[:size])
        text, first = text[size:], False
    return b"\r\n".join(lines) + b"\r\n"


def write_manifest_jar(path, main_class, class_path):
    """A jar that holds only META-INF/MANIFEST.MF: ``java -jar path`` runs ``main_class``
    with ``class_path`` (paths relative to the jar's folder)."""
    manifest = (_manifest_lines("Manifest-Version", "1.0")
                + _manifest_lines("Created-By", "thresher engines fetch")
                + _manifest_lines("Main-Class", main_class)
                + _manifest_lines("Add-Opens", ADD_OPENS)
                + _manifest_lines("Class-Path", " ".join(class_path)) + b"\r\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as jar:
        info = zipfile.ZipInfo("META-INF/MANIFEST.MF", date_time=(1980, 1, 1, 0, 0, 0))
        jar.writestr(info, manifest)


def library_jars(folder, eng):
    lib = os.path.join(folder, eng.lib)
    return sorted(name for name in os.listdir(lib) if name.endswith(".jar"))


def assemble(eng, scratch, folder):
    """Move the copied jars from ``scratch`` into ``folder``/<lib> and write the manifest
    jar; returns (jar path, [relative paths of every jar])."""
    lib = os.path.join(folder, eng.lib)
    if os.path.exists(lib):
        shutil.rmtree(lib)
    os.replace(os.path.join(scratch, "lib"), lib)
    jars = [f"{eng.lib}/{name}" for name in library_jars(folder, eng)]
    path = os.path.join(folder, eng.jar_name)
    write_manifest_jar(path + ".tmp", eng.main_class, jars)
    os.replace(path + ".tmp", path)
    return path, jars


# ---- binding Beam's gRPC servers to the address they are given -----------------------
#
# Every gRPC server of Beam's Java job server (the job and artifact ports, and per SDK
# environment the Fn API control, data, state, logging and provisioning servers) is made
# by ``org.apache.beam.sdk.fn.server.ServerFactory$InetSocketAddressServerFactory``, whose
# ``createServer(services, InetSocketAddress address)`` starts with
# ``NettyServerBuilder.forPort(address.getPort())``: the host is dropped and the server
# listens on every interface, though the address it was given (and advertises) is
# loopback (``InetAddress.getLoopbackAddress()`` for the Fn API, ``--job-host``, default
# localhost, for the job port). No flag or system property changes it. For a local
# master thresher starts the job server from a second manifest jar whose Class-Path puts
# first a copy of that one class, rewritten to call ``NettyServerBuilder.forAddress
# (address)``: the same bytes otherwise (7 bytes of one method and 4 constants added).
SERVER_FACTORY = "org/apache/beam/sdk/fn/server/ServerFactory$InetSocketAddressServerFactory.class"
LOOPBACK_JAR = "thresher-bind-given-address.jar"


def _constant_pool(data):
    """[(tag, offset of its body)] indexed from 1 (None for the second slot of longs),
    and the offset just past the pool."""
    count = int.from_bytes(data[8:10], "big")
    entries, at, index = [None], 10, 1
    sizes = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2,
             17: 4, 18: 4, 19: 2, 20: 2}
    while index < count:
        tag = data[at]
        entries.append((tag, at + 1))
        if tag == 1:
            at += 3 + int.from_bytes(data[at + 1:at + 3], "big")
        else:
            at += 1 + sizes[tag]
        if tag in (5, 6):
            entries.append(None)
            index += 1
        index += 1
    return entries, at


def _u2(data, at):
    return int.from_bytes(data[at:at + 2], "big")


def _utf8(data, entries, index):
    tag, at = entries[index]
    assert tag == 1
    return data[at + 2:at + 2 + _u2(data, at)].decode("utf-8")


def _method(data, entries, index):
    """(class name, method name, descriptor) of a Methodref constant."""
    tag, at = entries[index]
    if tag != 10:
        return None
    klass, nat = _u2(data, at), _u2(data, at + 2)
    _, nat_at = entries[nat]
    return (_utf8(data, entries, _u2(data, entries[klass][1])),
            _utf8(data, entries, _u2(data, nat_at)), _utf8(data, entries, _u2(data, nat_at + 2)))


def bind_given_address(data):
    """The class bytes of SERVER_FACTORY with ``forPort(address.getPort())`` replaced by
    ``forAddress(address)``; ValueError when the bytes are not the shape expected."""
    entries, end = _constant_pool(data)
    get_port = for_port = None
    for index in range(1, len(entries)):
        if entries[index] is None:
            continue
        method = _method(data, entries, index)
        if method and method[:2] == ("java/net/InetSocketAddress", "getPort"):
            get_port = index
        if method and method[1] == "forPort" and method[0].endswith("/netty/NettyServerBuilder"):
            for_port, builder, result = index, method[0], method[2].split(")", 1)[1]
    if get_port is None or for_port is None:
        raise ValueError("ServerFactory no longer calls NettyServerBuilder.forPort")
    old = bytes([0x2B, 0xB6]) + get_port.to_bytes(2, "big") + b"\xb8" + for_port.to_bytes(2, "big")
    if data.count(old) != 1:
        raise ValueError("ServerFactory.createServer is not `forPort(address.getPort())`")
    count = _u2(data, 8)
    klass = _u2(data, entries[for_port][1])
    name, descriptor = b"forAddress", f"(Ljava/net/SocketAddress;){result}".encode()
    added = (b"\x01" + len(name).to_bytes(2, "big") + name
             + b"\x01" + len(descriptor).to_bytes(2, "big") + descriptor
             + b"\x0c" + count.to_bytes(2, "big") + (count + 1).to_bytes(2, "big")
             + b"\x0a" + klass.to_bytes(2, "big") + (count + 2).to_bytes(2, "big"))
    new = b"\x2b\x00\x00\x00\xb8" + (count + 3).to_bytes(2, "big")   # aload_1; nop x3
    data = data[:8] + (count + 4).to_bytes(2, "big") + data[10:end] + added + data[end:]
    return data.replace(old, new)


def write_loopback_jar(folder, eng):
    """``<lib>/LOOPBACK_JAR`` holding SERVER_FACTORY rewritten by :func:`bind_given_address`,
    and a second manifest jar that puts it first; returns (manifest jar, patch jar), both
    relative to ``folder``."""
    lib = os.path.join(folder, eng.lib)
    jars = library_jars(folder, eng)
    source = [name for name in jars if name.startswith("beam-sdks-java-core-")]
    if len(source) != 1:
        raise ValueError(f"no single beam-sdks-java-core jar in {lib}")
    with zipfile.ZipFile(os.path.join(lib, source[0])) as jar:
        patched = bind_given_address(jar.read(SERVER_FACTORY))
    patch = os.path.join(lib, LOOPBACK_JAR)
    with zipfile.ZipFile(patch + ".tmp", "w", zipfile.ZIP_DEFLATED) as jar:
        jar.writestr(zipfile.ZipInfo(SERVER_FACTORY, date_time=(1980, 1, 1, 0, 0, 0)), patched)
    os.replace(patch + ".tmp", patch)
    class_path = [f"{eng.lib}/{LOOPBACK_JAR}"] + [f"{eng.lib}/{name}" for name in jars
                                                  if name != LOOPBACK_JAR]
    name = loopback_jar_name(eng)
    write_manifest_jar(os.path.join(folder, name + ".tmp"), eng.main_class, class_path)
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
    return name, f"{eng.lib}/{LOOPBACK_JAR}"


def loopback_jar_name(eng):
    return eng.jar_name.replace("-thresher.jar", "-thresher-loopback.jar")
