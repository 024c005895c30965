"""The Delta jars resolve whatever the user's home holds: only the project's Ivy settings and cache.

Spark's default resolution looks in ``~/.m2/repository`` first, and a POM there without
its jar (which any ``mvn`` build can leave) failed every Delta session start with
JAVA_GATEWAY_EXITED. ``examples/delta_pipeline.py`` gives Spark the project's Ivy
settings (Maven Central only) and cache (``.venv/ivy``, shared with the demo: only the
first run downloads). A Delta session starts in a subprocess whose home holds POM-only
entries in ``~/.m2`` and junk in ``~/.ivy2*``, writes a Delta table and reads it back;
the home is left as it was. The JVM takes its home from the password database, not from
$HOME: ``-Duser.home`` (JAVA_TOOL_OPTIONS) moves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark  # a Spark driver of its own (with Delta), not the shared session

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DELTA = ("io.delta", "delta-spark_4.2_2.13", "4.4.0")
# What `mvn` leaves when a build needed only the POMs: the module's POM, no jar.
POM_ONLY = [DELTA, ("io.delta", "delta-storage", "4.4.0"), ("io.delta", "delta-kernel-api", "4.4.0"),
            ("org.antlr", "antlr4-runtime", "4.13.1")]

START = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from delta_pipeline import DeltaJarsError, delta_spark_session

out = Path(sys.argv[2])
try:
    spark = delta_spark_session("pymq-jar-resolution", spark_log=out / "spark.log")
except DeltaJarsError as e:
    print(f"DeltaJarsError: {e}")
    sys.exit(3)
spark.range(5).coalesce(1).write.format("delta").save(str(out / "table"))
print("rows", spark.read.format("delta").load(str(out / "table")).count())
spark.stop()
"""


def start_delta_session(out: Path, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run START with ``home`` as the user's home (for Python and for the JVM)."""
    out.mkdir(parents=True, exist_ok=True)
    java_opts = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -Duser.home={home}".strip()
    return subprocess.run(
        [sys.executable, "-c", START, str(EXAMPLES), str(out)],
        capture_output=True, text=True, timeout=600, cwd=out,
        env={**os.environ, "HOME": str(home), "JAVA_TOOL_OPTIONS": java_opts, **env},
    )


def used_home(home: Path) -> Path:
    """A home after a few ``mvn`` builds and Spark runs: POMs without jars, junk in the Ivy caches."""
    for group, artifact, version in POM_ONLY:
        d = home / ".m2" / "repository" / group.replace(".", "/") / artifact / version
        d.mkdir(parents=True)
        (d / f"{artifact}-{version}.pom").write_text(
            '<?xml version="1.0" encoding="UTF-8"?>\n<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
            f"  <modelVersion>4.0.0</modelVersion>\n  <groupId>{group}</groupId>\n"
            f"  <artifactId>{artifact}</artifactId>\n  <version>{version}</version>\n</project>\n"
        )
        (d / "_remote.repositories").write_text(f"{artifact}-{version}.pom>central=\n")
    group, artifact, version = DELTA
    for ivy in (".ivy2", ".ivy2.5.2"):
        cache = home / ivy / "cache" / group / artifact
        cache.mkdir(parents=True)
        (cache / f"ivy-{version}.xml").write_text("not an ivy file")
        (cache / f"ivydata-{version}.properties").write_text("resolver=local-m2-cache\n")
        (home / ivy / "jars").mkdir()
        (home / ivy / "jars" / f"{group}_{artifact}-{version}.jar").write_bytes(b"not a jar")
    return home


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in root.rglob("*")}


def test_delta_session_ignores_the_users_maven_and_ivy_caches(tmp_path: Path) -> None:
    home = used_home(tmp_path / "home")
    before = snapshot(home)
    out = tmp_path / "out"
    proc = start_delta_session(out, home)
    log = (out / "spark.log").read_text(errors="replace") if (out / "spark.log").exists() else ""
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{log[-6000:]}"
    assert "rows 5" in proc.stdout.splitlines()
    assert (out / "table" / "_delta_log").is_dir()
    assert "local-m2-cache" not in log  # Spark's default chain was not used
    cache_line = next(line for line in log.splitlines() if line.startswith("Ivy Default Cache set to:"))
    assert str(home) not in cache_line
    assert snapshot(home) == before  # nothing in the home was written (nor rewritten)


def test_unresolvable_jars_say_what_failed_and_what_to_do(tmp_path: Path) -> None:
    """No bare JAVA_GATEWAY_EXITED: what could not be resolved, where the report is, what to do."""
    empty = tmp_path / "empty-repo"
    empty.mkdir()
    settings = tmp_path / "ivysettings.xml"  # a "mirror" without the jars: fails offline, fast
    settings.write_text(
        '<ivysettings><settings defaultResolver="mirror"/><resolvers>'
        f'<ibiblio name="mirror" m2compatible="true" root="{empty.as_uri()}/"/>'
        "</resolvers></ivysettings>\n"
    )
    out = tmp_path / "out"
    proc = start_delta_session(out, used_home(tmp_path / "home"), PYMQ_IVY_SETTINGS=str(settings),
                               PYMQ_IVY_CACHE=str(tmp_path / "ivy"))
    assert proc.returncode == 3, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    # (the JVM's stdout has Ivy's ":: loading settings" line too)
    message = proc.stdout[proc.stdout.index("DeltaJarsError: "):]
    assert message.startswith(f"DeltaJarsError: could not resolve {':'.join(DELTA)} into {tmp_path / 'ivy'}")
    assert f"(see {out / 'spark.log'})" in message
    assert "repo1.maven.org" in message and "PYMQ_IVY_SETTINGS" in message
    assert "unresolved dependency: io.delta#delta-spark_4.2_2.13;4.4.0: not found" in message
    assert "JAVA_GATEWAY_EXITED" not in message
