"""A run's placeholders are owed a release until the injector has dropped them.

A run that registers with the injector first makes RUN_DIR/releases/RUN_ID and holds an
flock on it for as long as it lives; once the injector has released the run, the file
goes. A file nobody holds is a release still owed: the run's release failed (the
injector was down or restarting), or its kooi run died and the dead run's finisher could
not reach the injector either. Before, such a run's placeholders stayed live until their
time to live ran out (the workflow's timeout plus ten minutes), across a restart of the
injector that read them back from its registry (review 27, F3): a placeholder the
workload had left in the project worked for the next run's workload.

Every `kooi run` on the host that holds secrets, and the hourly `kooi gc`, settle what
is owed (`settle`) before anything else; the dead run's finisher (run.deadrun) releases
through `release` too. The lock tells a live run's file from an owed one: a run whose
process is gone holds nothing."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

SUBDIR = "releases"


class Owed:
    """RUN_ID's release, owed from before it registers until the injector has released it."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        d = run_dir / SUBDIR
        d.mkdir(mode=0o750, exist_ok=True)
        self.path = d / run_id
        # Locked before it has its name: `settle` never finds it unheld while the run lives.
        new = d / f"{run_id}~"  # not a run id (RUN_RE): settle passes it by
        new.unlink(missing_ok=True)
        self.fd: int | None = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(new, self.path)

    def paid(self) -> None:
        """Released (or never registered): nothing owed."""
        self.path.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        """Still owed: the file stays for the next run or `kooi gc`."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def release(run_dir: Path, sc: Any, run_id: str) -> dict[str, Any] | None:
    """Release RUN_ID's placeholders: the injector's record of the run (None: it held no
    such run); what was owed for it is paid. InjectError when the injector does not
    answer (still owed)."""
    from .. import inject

    rec: dict[str, Any] | None = inject.call(sc, {"op": "release", "run": run_id}).get("record")
    (run_dir / SUBDIR / run_id).unlink(missing_ok=True)
    return rec


def owed(run_dir: Path) -> list[str]:
    """The runs whose release may be owed (their process may still be live)."""
    from ..injectcontrol import RUN_RE

    try:
        return sorted(e.name for e in os.scandir(run_dir / SUBDIR) if RUN_RE.match(e.name))
    except OSError:
        return []


def settle(run_dir: Path, sc: Any) -> list[str]:
    """Release every run whose release is owed and whose process is gone; one item for
    each run whose placeholders were still live ("placeholders of run ..."), and a
    warning where the injector does not answer (tried again next time)."""
    from .. import inject

    d = run_dir / SUBDIR
    out: list[str] = []
    for name in owed(run_dir):
        try:
            fd = os.open(d / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue  # paid meanwhile, or not a file kooi made
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live run's
        try:
            rec = release(run_dir, sc, name)
        except inject.InjectError as exc:
            out.append(f"warning: the placeholders of run {name} are still owed a release ({exc}); kooi tries "
                       "again at the next run and `kooi gc`")
            break
        finally:
            os.close(fd)
        if rec:
            out.append(f"placeholders of run {name} (its own release had failed; it forwarded "
                       f"{rec.get('forwarded', 0)} request(s), refused {len(rec.get('refused') or [])})")
    return out
