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
