"""The hostile suite, the project's git (issue 29, finding 1, and the second hostile review
of issue 28's change): git runs code from a repository's configuration and hooks, with no
prompt, whenever anyone runs `git status` in the project on the host (an editor does so
all the time). A workload must not get code of its choosing there, while the run runs
(when the host's git sees the project as the workload leaves it at that moment) or
after it:

- it renames `.git` away and makes a new one whose config names a core.fsmonitor;
- it points git at another common directory (`.git/commondir`) or at another config
  (`.git/config.worktree`);
- it writes an existing nested repository's config (a gitlink of the project);
- it makes a nested repository of its own, with a core.fsmonitor, and commits it as a
  gitlink (git then runs `git status` in it, with GIT_DIR set, past safe.directory);
- in a project that is no repository, it makes one.

The host runs `git status` (as the runner, and as root with safe.directory='*') while the
workload waits, and again after the run; a payload leaves /tmp/kooi-hostile-git-*.
The workload's own commit must reach the host's repository (the agent's work is kept).
Container and jail mode; this machine's rootless engine and the userns-remap host."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from kooi.checks import Context

WFDIR = "/var/lib/kooi/hostile-workflows"
MARK = "/tmp/kooi-hostile-git"
# The workload's side (sh; git from the image or, in a jail, the host's /usr). Each
# attempt prints `HOSTILE name rc`; then it tells the host to look, and waits.
ATTACK = r"""
cd /workspace
payload() { git -C "$1" config core.fsmonitor "touch $MARK-$2; false"; }
export GIT_AUTHOR_NAME=w GIT_AUTHOR_EMAIL=w@w GIT_COMMITTER_NAME=w GIT_COMMITTER_EMAIL=w@w
# what tools run from a subdirectory: cargo's rustc-wrapper, direnv
mkdir -p crates/x/.cargo sub && printf '[build]\nrustc-wrapper = "/tmp/x"\n' > crates/x/.cargo/config.toml \
  && echo "touch $MARK-envrc" > sub/.envrc; echo "HOSTILE deep $?"
if git rev-parse -q --git-dir >/dev/null 2>&1; then
  # the agent's work, which must reach the host
  echo work > work.txt && git add work.txt && git commit -q -m work; echo "HOSTILE commit $?"
  # the project's own config
  payload . config; echo "HOSTILE config $?"
  # an existing nested repository (a gitlink of the project)
  payload existing-lib existing; echo "HOSTILE existing-config $?"
  printf '#!/bin/sh\ntouch %s-existing-hook\n' "$MARK" > existing-lib/.git/hooks/post-checkout
  # ... moved aside past its mounts, and a git directory of the workload's in its place
  mv existing-lib existing-moved && mkdir -p existing-lib/.git/objects existing-lib/.git/refs/heads \
    && echo 'ref: refs/heads/main' > existing-lib/.git/HEAD \
    && printf '[core]\n\tfsmonitor = touch %s-moved; false\n' "$MARK" > existing-lib/.git/config
  echo "HOSTILE nested-moved $?"
  # a nested repository of the workload's, committed as a gitlink
  git init -q vendor-lib && echo v > vendor-lib/v && git -C vendor-lib add v && git -C vendor-lib commit -q -m v \
    && payload vendor-lib nested && git add vendor-lib && git commit -q -m vendor; echo "HOSTILE nested $?"
  # (the third review) a repository split over a commondir, one in git's own objects, a
  # toolchain at a path of the workload's
  branch=$(git symbolic-ref -q HEAD)
  mkdir -p .cache/c/refs/heads src && cp -r .git/objects .cache/c/ && cp ".git/$branch" .cache/c/refs/heads/ \
    && echo "ref: $branch" > src/HEAD && echo ../.cache/c > src/commondir \
    && printf '[core]\n\tpager = touch %s-commondir-layout\n' "$MARK" > .cache/c/config
  echo "HOSTILE commondir-layout $?"
  mkdir -p .git/objects/ev/objects .git/objects/ev/refs && echo "ref: $branch" > .git/objects/ev/HEAD \
    && printf '[core]\n\tpager = touch %s-objects-layout\n' "$MARK" > .git/objects/ev/config
  echo "HOSTILE objects-layout $?"
  hostpath=$(awk '$5=="/workspace"{print $4}' /proc/self/mountinfo | head -1)
  printf '[toolchain]\npath = "%s/.tc"\n' "$hostpath" > rust-toolchain.toml; echo "HOSTILE toolchain $?"
  # git's data turned against the host (the second review of this change): a reflog that
  # is a link out of the project, a rebase stopped before an exec the host would run on
  # `git rebase --continue`
  rm -f .git/logs/HEAD && ln -s $MARK-reflog .git/logs/HEAD; echo "HOSTILE reflog-link $?"
  GIT_SEQUENCE_EDITOR="printf 'break\nexec touch $MARK-rebase\n' >" git rebase -q -i HEAD >/dev/null 2>&1
  echo "HOSTILE rebase $?"
  # another common directory, another worktree config
  git init -q --bare evil-common && payload evil-common commondir && echo ../evil-common > .git/commondir
  echo "HOSTILE commondir $?"
  printf '[core]\n\tfsmonitor = touch %s-worktree; false\n' "$MARK" > .git/config.worktree
  git config extensions.worktreeConfig true; echo "HOSTILE worktree-config $?"
  # .git renamed away, a new one in its place
  mv .git .git-away && cp -a .git-away .git && payload . rename; echo "HOSTILE rename $?"
  # an index entry inside .git (a `git restore .` on the host would write the hook)
  printf '#!/bin/sh\ntouch %s-index-hook\n' "$MARK" > h && blob=$(git hash-object -w h) && rm h \
    && git update-index --add --cacheinfo "100755,$blob,xgit/hooks/post-checkout" && python3 -c '
import hashlib; p = ".git/index"; d = open(p, "rb").read()[:-20]
d = d.replace(b"xgit/hooks/post-checkout", b".git/hooks/post-checkout"); open(p, "wb").write(d + hashlib.sha1(d).digest())'
  echo "HOSTILE index $?"
  git update-index --split-index; echo "HOSTILE split-index $?"
  # no HEAD (git would take the project's top for a bare repository of the workload's)
  branch=$(git symbolic-ref -q HEAD); rm -f .git/HEAD && mkdir -p objects/info refs/heads \
    && echo ../.git/objects > objects/info/alternates && cp ".git/$branch" "refs/heads/${branch##*/}" \
    && echo "ref: $branch" > HEAD && printf '[core]\n\tpager = touch %s-bare\n' "$MARK" > config
  echo "HOSTILE head $?"
else
  git init -q . && payload . init; echo "HOSTILE init $?"
  # the project's top laid out as a bare repository, with a commit and a pager of its own
  mkdir -p objects refs/heads && echo 'ref: refs/heads/main' > HEAD \
    && t=$(GIT_DIR=/workspace git mktree </dev/null) && c=$(GIT_DIR=/workspace git commit-tree "$t" -m x) \
    && echo "$c" > refs/heads/main && printf '[core]\n\tpager = touch %s-bare-top\n' "$MARK" > config
  echo "HOSTILE bare-top $?"
fi
touch /workspace/.kooi-hostile-ready
i=0; while [ ! -e /workspace/.kooi-hostile-looked ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
echo "HOSTILE done"
"""


@pytest.fixture(scope="module")
def ctx(host):
    c = Context.from_host(host)
    if "runner" not in (c.described(host, "images") or {}):
        pytest.fail("no runner image pinned on this host: the hostile suite needs it")
    return c


def as_runner(host, ctx, cmd: str):
    return host.run(f"runuser -u {ctx.runner} -- sh -c {shlex.quote(cmd)}")


def git_status(host, ctx, project: str) -> str:
    """What the host's git does in the project after the run: status as the runner and as
    root past safe.directory (with submodules: the gitlinks), a log in a terminal (the
    pager), a commit (the reflog), a rebase continued, a restore then a checkout (the
    index's entries, the hooks)."""
    root = "git -c safe.directory='*' -c user.name=h -c user.email=h@h"
    host.run(f"cd {project} && runuser -u {ctx.runner} -- git status --porcelain >/dev/null 2>&1; "
             f"{root} status --porcelain >/dev/null 2>&1; "
             f"runuser -u {ctx.runner} -- git -C existing-lib status >/dev/null 2>&1; "
             f"script -qc \"{root} log -1\" /dev/null >/dev/null 2>&1; "
             f"{root} commit -q --allow-empty -m host >/dev/null 2>&1; "
             f"{root} rebase --continue >/dev/null 2>&1; "
             f"{root} restore . >/dev/null 2>&1; {root} checkout -q -b hostile-after >/dev/null 2>&1; "
             f"script -qc \"{root} -C src log -1\" /dev/null >/dev/null 2>&1; "
             f"script -qc \"{root} -C .git/objects/ev branch\" /dev/null >/dev/null 2>&1; true")
    return host.run(f"ls {MARK}-* 2>/dev/null").stdout.strip()


@pytest.fixture(scope="module", params=["container", "jail", "jail-no-repo"])
def attacked(request, host, ctx):
    """One hostile run: (name, project, rc, output, result, payloads seen while it ran,
    payloads seen after it)."""
    mode = request.param.split("-")[0]
    name = f"hostile-git-{request.param}"
    home = ctx.engine.runner_home
    project = f"{home}/kooi-hostile/{name}"
    # safe.directory: the workload's uid is not the project owner's in a container
    env = {"MARK": MARK, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    doc: dict = {"mode": mode, "timeout": 120, "environment": env,
                 "command": ["sh", "-c", ATTACK]}
    if mode == "container":
        doc["image"] = "runner"
    text = yaml.safe_dump(doc, sort_keys=False)
    host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/{name}.yml "
             f"&& chmod 0644 {WFDIR}/{name}.yml; rm -f {MARK}-*; rm -rf {project}")
    setup = f"mkdir -p {project} && cd {project}"
    if request.param != "jail-no-repo":
        setup += (" && git init -q . && git init -q existing-lib && echo e > existing-lib/e"
                  " && git -C existing-lib add e && git -C existing-lib -c user.email=t@t -c user.name=t commit -q -m e"
                  " && git add existing-lib && git -c user.email=t@t -c user.name=t commit -q -m init")
    assert as_runner(host, ctx, setup).succeeded
    out = f"/var/lib/kooi/runs/{name}.json"
    script = f"""
rm -f {out}
KOOI_WORKFLOW_DIR={WFDIR} kooi run {name} --project {shlex.quote(project)} --json {out} \
  > /var/lib/kooi/runs/{name}.out 2>&1 &
pid=$!
i=0; while [ ! -e {project}/.kooi-hostile-ready ] && kill -0 $pid 2>/dev/null && [ $i -lt 1200 ]; do
  sleep 0.1; i=$((i+1)); done
echo "ready after $i"
"""
    host.run(script + f"""
cd {project} && runuser -u {ctx.runner} -- git status --porcelain >/dev/null 2>&1
git -c safe.directory='*' status --porcelain >/dev/null 2>&1
git -c safe.directory='*' diff >/dev/null 2>&1
mkdir -p sub && script -qc "git -c safe.directory='*' -C sub log -1" /dev/null >/dev/null 2>&1
echo during: $(ls {MARK}-* 2>/dev/null) > /var/lib/kooi/runs/{name}.during
runuser -u {ctx.runner} -- touch {project}/.kooi-hostile-looked
wait $pid; echo "rc=$?" >> /var/lib/kooi/runs/{name}.during
""")
    during_doc = host.file(f"/var/lib/kooi/runs/{name}.during").content_string
    rc = int(during_doc.rpartition("rc=")[2].strip() or -1)
    during = during_doc.splitlines()[0].removeprefix("during:").strip()
    output = host.file(f"/var/lib/kooi/runs/{name}.out").content_string
    result = json.loads(host.file(out).content_string) if host.file(out).exists else {}
    after = git_status(host, ctx, project)
    assert "HOSTILE done" in output, f"the attack did not run to its end (rc {rc}):\n{output[-4000:]}"
    yield request.param, project, rc, output, result, during, after
    host.run(f"rm -f {MARK}-*")


def test_no_git_payload_runs_on_the_host_during_or_after_the_run(host, ctx, attacked):
    param, project, rc, output, result, during, after = attacked
    assert during == "", f"{param}: the host's git ran the workload's code while the run ran: {during}\n{output}"
    assert after == "", f"{param}: the host's git ran the workload's code after the run: {after}\n{output}"
    assert rc == 0 and result["reason"] == "ok", output[-3000:]


def test_what_the_workload_did_to_git_is_listed(host, ctx, attacked):
    param, project, rc, output, result, during, after = attacked
    refused = {(r["path"], r["how"]) for r in result["project_guard"]["refused"]}
    assert {("crates/x/.cargo", "put back"), ("sub/.envrc", "put back")} <= refused, refused
    assert not host.file(f"{project}/crates/x/.cargo").exists and not host.file(f"{project}/sub/.envrc").exists
    if param == "jail-no-repo":
        assert (".git", "put back") in refused or (".git", "shadowed") in refused, refused
        assert not host.file(f"{project}/.git").exists
        return
    paths = {p for p, _ in refused}
    assert any(p in (".git/index", ) or p.startswith(".git/sharedindex.") for p in paths), sorted(refused)
    for want in (".git/config", ".git/commondir", ".git/config.worktree", "vendor-lib/.git",
                 "existing-lib/.git/config", "existing-lib/.git/hooks/post-checkout", ".git/HEAD",
                 ".git/rebase-merge", ".git/logs/HEAD", "existing-moved/.git", "src/HEAD",
                 ".git/objects/ev/HEAD", "rust-toolchain.toml"):
        assert any(p == want or p.startswith(want + "/") for p in paths), (want, sorted(refused))
    assert not host.file(f"{project}/vendor-lib/.git/config").exists  # its data stays
    assert not host.file(f"{project}/.git/commondir").exists


def test_the_workloads_commit_reaches_the_host(host, ctx, attacked):
    """Git's objects and refs are the workload's to add to (its index, refused here for
    the entry inside .git, is kept out; tests/e2e/test_guard.py shows it copied back)."""
    param, project, rc, output, result, during, after = attacked
    if param == "jail-no-repo":
        return
    assert "HOSTILE commit 0" in output, output
    log = as_runner(host, ctx, f"git -C {project} log --format=%s")
    assert "work" in log.stdout.split(), log.stdout + log.stderr
    head = host.file(f"{project}/.git/HEAD")
    assert head.exists and head.content_string.startswith("ref: refs/heads/"), "the project's HEAD is gone"
    assert not host.file(f"{project}/.git/logs/HEAD").is_symlink
    assert not host.file(f"{project}/.git/rebase-merge").exists


# kill -9 of `kooi run` (the OOM killer, an operator; the third hostile review): the
# workload writes what the guard must take back, before kooi dies and (a container lives
# on until its deadline) after. Whoever next holds the project (the next run on it, or the
# hourly `kooi gc`) must first end the dead run's containers and finish its check: before,
# the next run's snapshot took the workload's files as the project's own.
KILLED = r"""
cd /workspace
mkdir -p sub && echo "touch $MARK-early" > sub/.envrc
touch /workspace/.kooi-hostile-ready
i=0; while [ ! -e /workspace/.kooi-hostile-killed ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo "touch $MARK-late" > .envrc && mkdir -p deep/er && echo "touch $MARK-late" > deep/er/.envrc
git config core.pager "touch $MARK-late-pager"
touch /workspace/.kooi-hostile-wrote
sleep 600
"""


# "queued": the next run was started with --wait while the killed run was still
# preparing (it held the project's lock, its record not yet written); it must finish the
# dead run's check once it holds the lock (the fourth hostile review: it read the records
# before waiting, took the dead run's files into its snapshot and overwrote its record).
# "renamed": the project was moved after kooi run died (the fifth hostile review: the run
# on its new path found the record, looked at the old path, dropped the record without a
# result and took the leftovers for the project's own); `kooi gc`, which finds nothing at
# the old path, must keep the record for whoever runs on the project where it is now.
@pytest.mark.parametrize("mode,finisher", [("container", "gc"), ("jail", "run"), ("container", "queued"),
                                           ("jail", "renamed")])
def test_a_killed_runs_check_is_finished_before_anyone_uses_the_project(host, ctx, mode, finisher):
    name = f"hostile-killed-{mode}"
    project = f"{ctx.engine.runner_home}/kooi-hostile/{name}"
    env = {"MARK": MARK, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    docs = {name: {"mode": mode, "timeout": 600, "environment": env, "command": ["sh", "-c", KILLED]},
            f"{name}-next": {"mode": mode, "timeout": 60, "command": ["true"]}}
    for n, doc in docs.items():
        if mode == "container":
            doc["image"] = "runner"
        text = yaml.safe_dump(doc, sort_keys=False)
        host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/{n}.yml "
                 f"&& chmod 0644 {WFDIR}/{n}.yml")
    host.run(f"rm -f {MARK}-*; rm -rf {project}")
    assert as_runner(host, ctx, f"mkdir -p {project} && cd {project} && git init -q . && echo x > x && git add x "
                                "&& git -c user.email=t@t -c user.name=t commit -q -m init").succeeded
    out = f"/var/lib/kooi/runs/{name}.out"
    nxt = f"KOOI_WORKFLOW_DIR={WFDIR} kooi run {name}-next --project {shlex.quote(project)} " \
          f"--json /var/lib/kooi/runs/{name}-next.json"
    # queued: stop the run once it holds the lock (its first line), before it writes its
    # record (after it has made its container); the next run starts and waits for the lock.
    queue = "" if finisher != "queued" else f"""
i=0; while ! grep -q ': workflow {name} ' {out} && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
kill -STOP $pid
id=$(sed -n 's/^.*run \\([^ :]*\\): workflow.*/\\1/p' {out} | head -1)
echo "records before: $(grep -l "\\"$id\\"" /var/lib/kooi/runs/guards/*.json 2>/dev/null | wc -l) ($id)"
{nxt} --wait 300 > {out}.next 2>&1 &
nextpid=$!
sleep 4
kill -CONT $pid"""
    # The output file goes first: the background run truncates it only once its shell
    # has forked, and "queued" waits for its first line (an earlier parameter's file,
    # same name, made it stop the run before it held the lock: CI, stop 38).
    killed = host.run(f"""
rm -f {out} {out}.next
KOOI_WORKFLOW_DIR={WFDIR} kooi run {name} --project {shlex.quote(project)} > {out} 2>&1 &
pid=$!{queue}
i=0; while [ ! -e {project}/.kooi-hostile-ready ] && kill -0 $pid 2>/dev/null && [ $i -lt 1200 ]; do
  sleep 0.1; i=$((i+1)); done
kill -9 $pid; wait $pid 2>/dev/null
runuser -u {ctx.runner} -- touch {project}/.kooi-hostile-killed
i=0; while [ ! -e {project}/.kooi-hostile-wrote ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "wrote: $(ls {project}/.kooi-hostile-wrote 2>/dev/null)"
[ -z "${{nextpid:-}}" ] || {{ wait $nextpid; echo "next rc=$?"; }}
""")
    output = host.file(out).content_string
    dead = output.partition("run ")[2].partition(":")[0]
    assert dead.startswith(name), output
    if mode == "container" and finisher != "queued":  # the queued run may remove it first
        assert "wrote: " + project in killed.stdout, "the container did not outlive its kooi run: " + killed.stdout
    if finisher == "gc":
        fin = host.run("kooi gc")  # root's; the cron's runs as the runner
    elif finisher == "run":
        fin = host.run(nxt)
    elif finisher == "renamed":
        moved = f"{project}-moved"
        host.run(f"rm -rf {moved}")
        assert as_runner(host, ctx, f"mv {project} {moved}").succeeded
        gc = host.run("kooi gc")
        assert gc.rc == 0 and dead in gc.stdout + gc.stderr, gc.stdout + gc.stderr  # it says it cannot find it
        kept = host.run(f"grep -l '\"{dead}\"' /var/lib/kooi/runs/guards/*.json")
        assert kept.rc == 0, "kooi gc dropped the record of a dead run whose project moved:\n" + gc.stdout
        fin = host.run(nxt.replace(f"--project {shlex.quote(project)} ", f"--project {shlex.quote(moved)} "))
        project = moved
    if finisher == "queued":
        assert "records before: 0" in killed.stdout, "the run was stopped too late to test the window: " + killed.stdout
        assert "next rc=0" in killed.stdout, killed.stdout + host.file(f"{out}.next").content_string
        what = host.file(f"{out}.next").content_string
    else:
        assert fin.rc == 0, fin.stdout + fin.stderr
        what = fin.stdout + fin.stderr
    assert dead in what, f"the {finisher} does not say it finished run {dead}'s check:\n{what}"
    left = host.run(f"runuser -u {ctx.runner} -- env DOCKER_HOST=unix://{ctx.engine.socket} "
                    f"XDG_RUNTIME_DIR=/run/user/{ctx.engine.runner_uid} "
                    f"docker ps -aq --filter label=org.kooi.run={dead}").stdout.strip()
    assert left == "", f"containers of the dead run {dead} are left: {left}"
    for p in (".envrc", "sub/.envrc", "deep/er/.envrc"):
        assert not host.file(f"{project}/{p}").exists, f"{p}, left by the killed run {dead}, is still there:\n{what}"
    assert "pager" not in host.file(f"{project}/.git/config").content_string
    # The dead run's result: what its workload did, as a run's own check would have listed it.
    res = json.loads(host.file(f"/var/lib/kooi/runs/results/{dead}.json").content_string)
    jsonschema.validate(res, json.loads((Path(__file__).parents[2] / "docs/run-result.schema.json").read_text()))
    assert res["reason"] == "interrupted", res
    paths = {r["path"] for r in res["project_guard"]["refused"]}
    assert "sub/.envrc" in paths, res["project_guard"]
    if mode == "container" and finisher != "queued":
        assert {".envrc", "deep/er/.envrc"} <= paths or {".envrc", "deep"} <= paths, res["project_guard"]
    assert host.run(f"ls {MARK}-* 2>/dev/null").stdout.strip() == ""


# The fifteenth review: what the host's tools take from the project besides git's own
# configuration, each hidden from a review of `git status`:
# - a package next to a module of the project's (Python imports `app/` before `app.py`),
#   ignored by a .gitignore of its own;
# - the refs a review compares against (the remote-tracking branch, a tag) moved to the
#   run's commit: `git diff origin/main` shows nothing;
# - pytest 9's own configuration (pytest.toml) loading a plugin, hidden by a .gitignore
#   that ignores itself;
# - a protected file staged in the index, not in the work tree (`git checkout -- .`
#   on the host writes it);
# - a protected directory that is a link into the project (.vscode -> tools/vscode):
#   its files changed through the target.
REVIEW15 = r"""
cd /workspace
export GIT_AUTHOR_NAME=w GIT_AUTHOR_EMAIL=w@w GIT_COMMITTER_NAME=w GIT_COMMITTER_EMAIL=w@w
mkdir -p app && printf 'import os\nos.system("touch %s-package")\n' "$MARK" > app/__init__.py \
  && printf '*\n' > app/.gitignore; echo "HOSTILE package $?"
echo "# the run" >> app.py && git commit -qam work && git update-ref refs/remotes/origin/main HEAD \
  && git tag -f v1.0 HEAD >/dev/null; echo "HOSTILE refs $?"
mkdir -p tests && printf '[pytest]\naddopts = ["-p", "tests.zz_plug"]\n' > pytest.toml \
  && printf 'import os\nos.system("touch %s-plugin")\n' "$MARK" > tests/zz_plug.py \
  && printf 'zz_plug.py\n.gitignore\n' > tests/.gitignore; echo "HOSTILE pytest $?"
echo "touch $MARK-staged" > .envrc && git add .envrc && rm .envrc; echo "HOSTILE staged $?"
printf '{"version": "2.0.0", "tasks": [{"label": "x", "type": "shell", "command": "touch %s-linked",
  "runOptions": {"runOn": "folderOpen"}}]}\n' "$MARK" > tools/vscode/tasks.json; echo "HOSTILE linked $?"
echo "HOSTILE done"
"""


def review_run(host, ctx, name: str, mode: str, script: str, setup):
    """One hostile run of SCRIPT (workflow NAME, MODE) on a fresh project at
    ~/kooi-hostile/NAME that the command SETUP(project) made as the runner: (the
    project, the run's command result, its JSON result)."""
    project = f"{ctx.engine.runner_home}/kooi-hostile/{name}"
    env = {"MARK": MARK, "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    doc: dict = {"mode": mode, "timeout": 120, "environment": env, "command": ["sh", "-c", script]}
    if mode == "container":
        doc["image"] = "runner"
    text = yaml.safe_dump(doc, sort_keys=False)
    host.run(f"install -d -m 0755 {WFDIR} && printf %s {shlex.quote(text)} > {WFDIR}/{name}.yml "
             f"&& chmod 0644 {WFDIR}/{name}.yml; rm -f {MARK}-*; rm -rf {project}")
    assert as_runner(host, ctx, setup(project)).succeeded
    out = f"/var/lib/kooi/runs/{name}.json"
    run = host.run(f"rm -f {out}; KOOI_WORKFLOW_DIR={WFDIR} kooi run {name} --project {shlex.quote(project)} "
                   f"--json {out}")
    return project, run, json.loads(host.file(out).content_string) if host.file(out).exists else {}


@pytest.fixture(scope="module", params=["container", "jail"])
def review15(request, host, ctx):
    mode = request.param
    project, run, result = review_run(
        host, ctx, f"hostile-review15-{mode}", mode, REVIEW15,
        lambda p: f"mkdir -p {p}/tools/vscode && cd {p} && git init -q . && echo 'X = 1' > app.py"
                  " && echo '{}' > tools/vscode/tasks.json && ln -s tools/vscode .vscode && git add -A"
                  " && git -c user.email=t@t -c user.name=t commit -q -m init"
                  " && git update-ref refs/remotes/origin/main HEAD && git tag v1.0")
    # What the host does next: import the project's module, discard the changes git shows.
    as_runner(host, ctx, f"cd {project} && python3 -c 'import app'")
    host.run(f"cd {project} && git -c safe.directory='*' checkout -- . >/dev/null 2>&1")
    after = host.run(f"ls {MARK}-* 2>/dev/null").stdout.strip()
    yield mode, project, run, result, after
    host.run(f"rm -f {MARK}-*")


def test_review15_nothing_of_the_workloads_runs_on_the_host(host, ctx, review15):
    mode, project, run, result, after = review15
    assert "HOSTILE done" in run.stdout and run.rc == 0, run.stdout[-3000:] + run.stderr
    for step in ("package", "refs", "pytest", "staged", "linked"):
        assert f"HOSTILE {step} 0" in run.stdout, (step, run.stdout[-3000:])
    assert after == "", f"{mode}: the host ran the workload's code: {after}"
    assert host.file(f"{project}/.vscode/tasks.json").content_string.strip() == "{}"
    assert not host.file(f"{project}/.envrc").exists, "the host's `git checkout -- .` wrote the staged .envrc"


def test_review15_what_the_workload_did_is_listed(host, ctx, review15):
    mode, project, run, result, after = review15
    guard = result["project_guard"]
    refused = {r["path"]: r for r in guard["refused"]}
    assert "tools/vscode/tasks.json" in refused, guard["refused"]
    assert "app/__init__.py" in refused and "kept" in refused["app/__init__.py"], guard["refused"]
    assert ".git/index" in refused, guard["refused"]  # the staged .envrc: the project's index kept
    changed = {c["path"] for c in guard["watched_changed"]}
    assert {"pytest.toml", "tests/.gitignore", "app/.gitignore", ".git/refs/remotes/origin/main",
            ".git/refs/tags/v1.0"} <= changed, guard["watched_changed"]
    # the work itself reached the host: the commit, and the refs as the workload left them
    log = as_runner(host, ctx, f"git -C {project} log --format=%s -1").stdout.strip()
    assert log == "work", log


# The sixteenth review, against review 15's fixes:
# - a link in the middle of a protected path's chain re-pointed (`tools` in
#   `.vscode -> tools/vscode`, `tools -> shared/tools`): VS Code read the workload's tasks;
# - HEAD left on refs/remotes/origin/main: the commit moved that ref, which then counted
#   as the run's own branch;
# - a link to a package beside a module (`app -> pkgsrc` beside app.py, `lib/util ->
#   utilp` beside lib/util.py);
# - a split index with a protected file staged: the shared part was refused, the index
#   naming it copied back, and every git command on the host failed;
# - a local GitHub action (what a watched workflow runs with `uses: ./...`).
REVIEW16 = r"""
cd /workspace
export GIT_AUTHOR_NAME=w GIT_AUTHOR_EMAIL=w@w GIT_COMMITTER_NAME=w GIT_COMMITTER_EMAIL=w@w
rm tools && mkdir -p evil/vscode && printf '{"version": "2.0.0", "tasks": [{"label": "x", "type": "shell",
  "command": "touch %s-chain", "runOptions": {"runOn": "folderOpen"}}]}\n' "$MARK" > evil/vscode/tasks.json \
  && ln -s evil tools; echo "HOSTILE chain $?"
git symbolic-ref HEAD refs/remotes/origin/main && git commit -q --allow-empty -m evil; echo "HOSTILE head $?"
mkdir -p pkgsrc lib/utilp && printf 'import os\nos.system("touch %s-linkpkg")\n' "$MARK" > pkgsrc/__init__.py \
  && cp pkgsrc/__init__.py lib/utilp/__init__.py && ln -s pkgsrc app && ln -s utilp lib/util; echo "HOSTILE linkpkg $?"
mkdir -p .github/actions/setup && echo 'runs: {using: composite, steps: []}' > .github/actions/setup/action.yml
echo "HOSTILE action $?"
git -c splitIndex.maxPercentChange=0 update-index --split-index && echo "touch $MARK-split" > .envrc \
  && git -c splitIndex.maxPercentChange=0 add .envrc && rm .envrc; echo "HOSTILE split $?"
echo "HOSTILE done"
"""


@pytest.fixture(scope="module", params=["container", "jail"])
def review16(request, host, ctx):
    mode = request.param
    project, run, result = review_run(
        host, ctx, f"hostile-review16-{mode}", mode, REVIEW16,
        lambda p: f"mkdir -p {p}/shared/tools/vscode {p}/lib && cd {p} && git init -q ."
                  " && echo '{}' > shared/tools/vscode/settings.json && ln -s shared/tools tools"
                  " && ln -s tools/vscode .vscode"
                  " && echo 'X = 1' > app.py && : > lib/__init__.py && echo 'Y = 1' > lib/util.py && git add -A"
                  " && git -c user.email=t@t -c user.name=t commit -q -m init"
                  " && git update-ref refs/remotes/origin/main HEAD && git tag v1.0 && git pack-refs --all")
    as_runner(host, ctx, f"cd {project} && python3 -c 'import app' ; python3 -c 'import lib.util'")
    status = as_runner(host, ctx, f"git -C {project} status --porcelain")
    after = host.run(f"ls {MARK}-* 2>/dev/null").stdout.strip()
    yield mode, project, run, result, status, after
    host.run(f"rm -f {MARK}-*")


def test_review16_nothing_of_the_workloads_runs_on_the_host(host, ctx, review16):
    mode, project, run, result, status, after = review16
    assert "HOSTILE done" in run.stdout and run.rc == 0, run.stdout[-3000:] + run.stderr
    for step in ("chain", "head", "linkpkg", "action", "split"):
        assert f"HOSTILE {step} 0" in run.stdout, (step, run.stdout[-3000:])
    assert after == "", f"{mode}: the host ran the workload's code: {after}"
    assert not host.file(f"{project}/.vscode/tasks.json").exists
    assert status.rc == 0, f"{mode}: the host's git fails in the project: {status.stderr}"
    head = host.file(f"{project}/.git/HEAD").content_string
    assert head.startswith("ref: refs/heads/"), head


def test_review16_what_the_workload_did_is_listed(host, ctx, review16):
    mode, project, run, result, status, after = review16
    guard = result["project_guard"]
    refused = {r["path"] for r in guard["refused"]}
    assert {"tools", "app", "lib/util", ".git/HEAD"} <= refused, guard["refused"]
    changed = {c["path"] for c in guard["watched_changed"]}
    assert {".git/refs/remotes/origin/main", ".github/actions/setup/action.yml"} <= changed, guard["watched_changed"]


# The seventeenth review: what a workload commits or stages without touching the work
# tree. A commit of its own on the project's branch (objects and a ref: nothing for the
# work-tree scan) carried `.envrc` and a module shadowing argparse; the host's `git stash`
# wrote them. A link out of the project and a stdlib shadow staged, then removed from
# the work tree: `git checkout -- .` wrote them back.
REVIEW17 = r"""
cd /workspace
export GIT_AUTHOR_NAME=w GIT_AUTHOR_EMAIL=w@w GIT_COMMITTER_NAME=w GIT_COMMITTER_EMAIL=w@w
branch=$(git symbolic-ref -q HEAD)
b=$(printf 'import os\nos.system("touch %s-committed")\n' "$MARK" | git hash-object -w --stdin) \
  && GIT_INDEX_FILE=/tmp/kooi-idx git read-tree HEAD \
  && GIT_INDEX_FILE=/tmp/kooi-idx git update-index --add --cacheinfo "100644,$b,.envrc" \
  && GIT_INDEX_FILE=/tmp/kooi-idx git update-index --add --cacheinfo "100644,$b,argparse.py" \
  && l=$(printf '../../../../../etc/passwd\0/../../../../../../../../../../top/x' | git hash-object -w --stdin) \
  && GIT_INDEX_FILE=/tmp/kooi-idx git update-index --add --cacheinfo "120000,$l,lnk" \
  && for i in 0 1 2 3 4 5 6 7 8 9 10; do git branch "b$i"; done \
  && t=$(GIT_INDEX_FILE=/tmp/kooi-idx git write-tree) \
  && git update-ref "$branch" "$(git commit-tree "$t" -p HEAD -m bump)"; echo "HOSTILE commit $?"
ln -s /root/.ssh target && printf 'import os\nos.system("touch %s-staged")\n' "$MARK" > json.py \
  && git add target json.py && rm target json.py; echo "HOSTILE staged $?"
echo "HOSTILE done"
"""


@pytest.fixture(scope="module", params=["container", "jail"])
def review17(request, host, ctx):
    mode = request.param
    project, run, result = review_run(
        host, ctx, f"hostile-review17-{mode}", mode, REVIEW17,
        lambda p: f"mkdir -p {p} && cd {p} && git init -q . && echo r > README && git add -A"
                  " && git -c user.email=t@t -c user.name=t commit -q -m init")
    host.run(f"cd {project} && git -c safe.directory='*' checkout -- . >/dev/null 2>&1")
    yield mode, project, run, result
    host.run(f"rm -f {MARK}-*")


def test_review17_what_the_workload_committed_is_listed_and_what_it_staged_is_not_kept(host, ctx, review17):
    mode, project, run, result = review17
    assert "HOSTILE commit 0" in run.stdout and "HOSTILE staged 0" in run.stdout, run.stdout[-3000:] + run.stderr
    guard = result["project_guard"]
    committed = {c["path"]: c["change"] for c in guard["watched_changed"] if "committed on" in c["change"]}
    # review 18: a link blob with a NUL (git's checkout stops there: ../../etc/passwd), and
    # eleven new branches sorted before the run's own one
    assert set(committed) == {".envrc", "argparse.py", "lnk"}, guard["watched_changed"]
    assert "argparse" in committed["argparse.py"] and "NUL" in committed["lnk"], committed
    assert any(c["path"] == ".git/refs" and c["change"].startswith("12 refs moved")
               for c in guard["watched_changed"]), guard["watched_changed"]
    index = [r for r in guard["refused"] if r["path"] == ".git/index"]
    assert index and "target" in index[0]["change"] and "json.py" in index[0]["change"], guard["refused"]
    assert not host.file(f"{project}/target").exists and not host.file(f"{project}/json.py").exists


# Session 29: commits reachable from what is not a branch. The review-17 check judged the
# branches the run moved; a tag, a remote-tracking branch, a detached HEAD and a stash
# (whose untracked files live in its third parent, out of its own tree) were only named
# as refs that moved, and `git checkout v2`, `git stash pop` or `git checkout -` wrote
# their `.envrc`, `.vscode/tasks.json` and shadowing module on the host. Review 25: a
# commit checked out and left (in HEAD's reflog only) came back with `git checkout -`.
REVIEW19 = r"""
cd /workspace
export GIT_AUTHOR_NAME=w GIT_AUTHOR_EMAIL=w@w GIT_COMMITTER_NAME=w GIT_COMMITTER_EMAIL=w@w
b=$(printf 'touch %s-committed\n' "$MARK" | git hash-object -w --stdin)
commit_with() {  # a commit on HEAD with the file $1 added, by plumbing only
  GIT_INDEX_FILE=/tmp/kooi-idx-$2 git read-tree HEAD \
    && GIT_INDEX_FILE=/tmp/kooi-idx-$2 git update-index --add --cacheinfo "100644,$b,$1" \
    && git commit-tree "$(GIT_INDEX_FILE=/tmp/kooi-idx-$2 git write-tree)" -p HEAD -m "$2"
}
git tag v2 "$(commit_with .envrc tag)"; echo "HOSTILE tag $?"
git update-ref refs/remotes/origin/feature "$(commit_with json.py remote)"; echo "HOSTILE remote $?"
mkdir -p .vscode && printf '{"version": "2.0.0", "tasks": [{"label": "x", "type": "shell",
  "command": "touch %s-stash", "runOptions": {"runOn": "folderOpen"}}]}\n' "$MARK" > .vscode/tasks.json \
  && git stash push -q -u -- .vscode && test ! -e .vscode/tasks.json; echo "HOSTILE stash $?"
br=$(git symbolic-ref --short HEAD) && git checkout -q "$(commit_with .mise.toml reflog)" \
  && git checkout -q "$br"; echo "HOSTILE reflog $?"
d=$(commit_with .devcontainer.json detached) && git update-ref --no-deref HEAD "$d"; echo "HOSTILE detached $?"
echo "HOSTILE done"
"""


@pytest.fixture(scope="module", params=["container", "jail"])
def review19(request, host, ctx):
    mode = request.param
    project, run, result = review_run(
        host, ctx, f"hostile-review19-{mode}", mode, REVIEW19,
        lambda p: f"mkdir -p {p} && cd {p} && git init -q . && echo r > README && git add -A"
                  " && git -c user.email=t@t -c user.name=t commit -q -m init")
    yield mode, project, run, result
    host.run(f"rm -f {MARK}-*")


def test_review19_commits_under_tags_remotes_stashes_and_a_detached_head_are_listed(host, ctx, review19):
    mode, project, run, result = review19
    for step in ("tag", "remote", "stash", "reflog", "detached"):
        assert f"HOSTILE {step} 0" in run.stdout, run.stdout[-3000:] + run.stderr
    guard = result["project_guard"]
    committed = {(c["path"], c["change"].split(" (", 1)[0]) for c in guard["watched_changed"]
                 if "committed on" in c["change"]}
    assert committed >= {(".envrc", "committed on refs/tags/v2"), ("json.py", "committed on refs/remotes/origin/feature"),
                         (".vscode/tasks.json", "committed on refs/stash^3"),
                         (".devcontainer.json", "committed on HEAD")}, guard["watched_changed"]
    left = [c for c in guard["watched_changed"] if c["path"] == ".mise.toml" and "committed in" in c["change"]]
    assert left and "reachable from HEAD@{" in left[0]["change"], guard["watched_changed"]
