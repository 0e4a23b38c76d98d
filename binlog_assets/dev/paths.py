"""Where the project keeps what set-up fetched and what the local stack writes.

Jars resolved by Maven live under `.cache/jars/<classpath>` and runtime state (broker
logs, the Dagster instance, the local lakehouse) under `var/`; both are git-ignored.
`BINLAKE_HOME` moves the whole tree (tests point it at a temporary directory).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    return Path(os.environ.get("BINLAKE_CACHE_DIR", REPO_ROOT / ".cache"))


def var_dir() -> Path:
    return Path(os.environ.get("BINLAKE_VAR_DIR", REPO_ROOT / "var"))


def jars_dir(classpath: str) -> Path:
    """The local folder of one Maven-resolved classpath (`kafka`, `delta`, ...).

    Raises FileNotFoundError with the set-up command when it has not been fetched, so a
    missing jar never turns into a silent download at run time.
    """
    path = cache_dir() / "jars" / classpath
    if not path.is_dir() or not any(path.glob("*.jar")):
        raise FileNotFoundError(
            f"no jars in {path}: run `make setup` (it resolves setup/maven/{classpath}/pom.xml)"
        )
    return path
