"""The label vocabulary kooi puts on engine objects, and the run lock key.

`kooi run` labels what it starts, the broker stamps what a workload starts through it,
`kooi run gc` finds leftovers by these labels and `kooi image` marks what it builds. They
must agree, so the names live here and nowhere else.
"""

from __future__ import annotations

import hashlib
import os
import re

PREFIX = "org.kooi"
MANAGED = f"{PREFIX}.managed"  # "1" on every container, network and volume of a run
RUN = f"{PREFIX}.run"  # the run id
WORKFLOW = f"{PREFIX}.workflow"  # the workflow name
PROJECT = f"{PREFIX}.project"  # the project path the run worked on
LOCK = f"{PREFIX}.lock"  # the name of the run lock its run holds (lock_key at its start)
NESTED = f"{PREFIX}.nested"  # "1" on what the workload started through its broker
SCAN = f"{PREFIX}.scan"  # "1" on the throw-away containers of image scans
INPUTS = f"{PREFIX}.inputs"  # on images: sha256 of what the image was built from
IMAGE = f"{PREFIX}.image"  # on images: the pin name (runner, ...)
BASE = f"{PREFIX}.base"  # on images: the pinned base image id
SESSION = f"{PREFIX}.session"  # "1" on a session's container (run.session)
PERSON = f"{PREFIX}.person"  # whose session it is, or whose kept home
HOME = f"{PREFIX}.home"  # "1" on a session's kept home (a volume no run's cleanup removes)


def run_labels(workflow: str, project: str, run_id: str) -> dict[str, str]:
    """The labels of the workload container and everything its run creates."""
    return {MANAGED: "1", RUN: run_id, WORKFLOW: workflow, PROJECT: project, LOCK: lock_key(project)}


def session_labels(person: str) -> dict[str, str]:
    """What a session's container carries besides its run's labels."""
    return {SESSION: "1", PERSON: person}


def home_labels(person: str, workflow: str) -> dict[str, str]:
    """A session's kept home: not MANAGED, so no run's or gc's cleanup takes it."""
    return {HOME: "1", PERSON: person, WORKFLOW: workflow}


def nested_labels(run_id: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """What the broker adds to objects a workload creates: it belongs to the run."""
    return {**(base or {MANAGED: "1", RUN: run_id}), NESTED: "1"}


_LOCK_NAME = re.compile(r"project-[0-9a-f]{1,16}(-[0-9a-f]{1,16})?\.lock")


def lock_key(project: str) -> str:
    """The name of the run lock of PROJECT: one run at a time per project, whatever its
    workflow (the project is one object shared by every run on it: a second run would
    take the first one's changes into its snapshot of the protected paths and put them
    back for good); `kooi gc` rebuilds it from a container's labels to see whether its
    run lives. Named by the directory's device and inode where it exists, so a second
    path to it (a bind mount) is the same project."""
    try:
        st = os.stat(project)
        return f"project-{st.st_dev:x}-{st.st_ino:x}.lock"
    except OSError:
        return f"project-{hashlib.sha256(project.encode()).hexdigest()[:16]}.lock"


def lock_key_of(labels: dict[str, str]) -> str:
    """The run lock of the run that made an object with LABELS: the name taken at its
    start (the project's path names another once the directory moved or went, and
    gc took a live run's containers for a dead one's), else rebuilt from the path."""
    key = labels.get(LOCK, "")
    return key if _LOCK_NAME.fullmatch(key) else lock_key(labels.get(PROJECT, ""))


# The names of sessions' kept homes (run.session.home_volume): kooi's own, never a
# workload's (review 14: bob's Testcontainers made alice's before her first session).
HOME_VOLUME_PREFIX = "kooi-home."
