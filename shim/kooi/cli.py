"""The `kooi` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import __version__
from .hoststate import HostStateError, paths
from .hoststate import egress as egress_state
from .hoststate import engine as engine_state
from .hoststate import limits as limits_state
from .hoststate import secrets as secrets_state

# Exit codes shared by every subcommand (documented in docs/cli.md).
EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3


def _engine(args: argparse.Namespace) -> int:
    from . import engine

    try:
        cfg = engine_state.load(args.config)
    except HostStateError as exc:
        print(f"kooi engine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.action == "start":
            st = engine.start(cfg, timeout=args.timeout)
        elif args.action == "stop":
            st = engine.stop(cfg)
        else:
            st = engine.status(cfg)
    except engine.EngineError as exc:
        print(f"kooi engine {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(engine.render(st, args.json))
    if args.action == "stop":
        return EXIT_OK if not st.running else EXIT_FAIL
    if st.running and st.drift:
        return EXIT_FAIL
    return EXIT_OK if st.running else EXIT_NOT_RUNNING


def _run(args: argparse.Namespace) -> int:
    from . import run

    res = run.execute(args.workflow, Path(args.project), Path(args.json) if args.json else None,
                      wait=args.wait, echo=None if args.quiet else sys.stdout,
                      engine_config=Path(args.config))
    if res.reason not in ("ok", "failed"):
        print(f"kooi run: {res.message}", file=sys.stderr)
    return res.exit_code


def _gc(args: argparse.Namespace) -> int:
    from . import run

    try:
        removed = run.gc(engine_config=Path(args.config), dry_run=args.dry_run, keep_days=args.keep_days)
    except HostStateError as exc:
        print(f"kooi gc: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - engine unreachable and the like
        print(f"kooi gc: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    from .run.deadrun import DEAD
    from .run.errors import neutral
    from .run.leftovers import WARNING

    verb = "would remove" if args.dry_run else "removed"
    # Names and messages come from what runs made (a workload named its network with
    # terminal escapes): shown, never obeyed, in root's terminal.
    for r in map(neutral, removed):
        if r.startswith(WARNING):
            print(f"kooi gc: {r}", file=sys.stderr)
        elif r.startswith(DEAD):
            print(f"kooi gc: {r}")  # a dead run's check (run.deadrun)
        else:
            print(f"{verb} {r}")
    print(f"kooi gc: {verb} {sum(1 for r in removed if not r.startswith((WARNING, *DEAD)))} item(s)")
    return EXIT_OK


def _workflow_check(args: argparse.Namespace) -> int:
    from . import workflow

    bad = 0
    try:
        # The secrets the workflows may name: the description the roles are about to
        # write (--secrets, from kooi_secrets) or the host's own.
        store = (secrets_state.parse(args.secrets, "--secrets") if args.secrets is not None
                 else secrets_state.load())
        # The most a workflow may ask for: likewise (--limits, from kooi_workflow_*_limits).
        host_limits = (limits_state.parse(args.limits, "--limits") if args.limits is not None
                       else limits_state.load())
    except HostStateError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    if args.inline is not None:
        try:
            flows = json.loads(args.inline)
        except ValueError as exc:
            print(f"--inline: not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if not isinstance(flows, dict):
            print("--inline: expected a mapping of workflow name to definition", file=sys.stderr)
            return EXIT_USAGE
        for name, data in flows.items():
            errors = workflow.check_inline(name, data, source=f"{args.source}: {name}")
            if not errors:
                errors = workflow.secret_errors(
                    data.get("secrets"), data.get("mode", "container"),
                    data.get("network") == "proxy" or bool(data.get("testcontainers")),
                    data.get("environment") or {}, f"{args.source}: {name}", store)
                errors += workflow.limit_errors(data.get("limits"), f"{args.source}: {name}", host_limits)
            for e in errors:
                print(e, file=sys.stderr)
            bad += bool(errors)
    for f in args.files:
        try:
            wf = workflow.parse(Path(f), args.name)
            errors = workflow.secret_errors_of(wf, store) + workflow.limit_errors_of(wf, host_limits)
            if errors:
                raise workflow.WorkflowError("\n".join(errors))
            print(f"{f}: ok ({wf.name}, {wf.mode})")
        except workflow.WorkflowError as exc:
            print(exc, file=sys.stderr)
            bad += 1
    return EXIT_USAGE if bad else EXIT_OK


def _image(args: argparse.Namespace) -> int:
    from . import image

    if args.action != "save" and not args.lock:
        print(f"kooi image {args.action}: --lock LOCK is required", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.action == "build":
            from . import engine

            cfg = engine_state.load(args.config)
            lock = image.load_lock(args.lock)
            ok, why = engine.ping(cfg)
            if not ok:
                print(f"kooi image build: the runner's engine at {cfg.socket} does not answer ({why}); "
                      "start it with `kooi engine start`", file=sys.stderr)
                return EXIT_NOT_RUNNING
            from . import egress

            client = engine.client(cfg, timeout=3600, operator=True)
            eg = egress_state.load_for(cfg)
            buildargs = egress.build_args(eg, cfg.mode, client) if eg and not args.check else None
            res = image.build(client, Path(args.context), lock, name=args.name, check=args.check,
                              archive_dir=Path(args.archive_dir) if args.archive_dir else None,
                              log=lambda line: print(line, file=sys.stderr), buildargs=buildargs,
                              prebuilt=Path(args.prebuilt) if args.prebuilt else None,
                              network_mode="host" if buildargs and cfg.mode == "rootless" else None)
            print(json.dumps(res))
        elif args.action == "save":
            from . import engine
            from .outputs import Output, OutputError

            if not args.out:
                print("kooi image save: --out FILE is required", file=sys.stderr)
                return EXIT_USAGE
            try:
                dest = Output(args.out, "--out", binary=True)
            except OutputError as exc:
                print(f"kooi image save: {exc}", file=sys.stderr)
                return EXIT_USAGE
            with dest:
                cfg = engine_state.load(args.config)
                pin = image.read_pins().get(args.name)
                if pin is None:
                    print(f"kooi image save: no pin {args.name!r} in {image.PINS_PATH}", file=sys.stderr)
                    return EXIT_FAIL
                tag = image.save(engine.client(cfg, timeout=3600, operator=True), pin, dest.stream())
                dest.commit()
            print(f"kooi image save: {tag} ({pin.id}) -> {args.out}")
        elif args.action == "verify":
            from . import engine

            cfg = engine_state.load(args.config)
            lock = image.load_lock(args.lock)
            client = engine.client(cfg, timeout=600, operator=True)
            pin = image.read_pins().get(args.name)
            if pin is None:
                print(f"kooi image verify: no pin {args.name!r} in {image.PINS_PATH}", file=sys.stderr)
                return EXIT_FAIL
            problems = image.verify_image(client, pin.id, lock)
            for p in problems:
                print(f"FAIL {p}")
            print(f"kooi image verify: {pin.id}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
            return EXIT_FAIL if problems else EXIT_OK
        elif args.action == "lock":
            from .outputs import Output, OutputError

            lock_path = Path(args.lock)
            out = Path(args.out) if args.out else None
            try:
                Output(out or lock_path, "--out" if out else "--lock").abandon()  # writable, before any work
            except OutputError as exc:
                print(f"kooi image lock: {exc}", file=sys.stderr)
                return EXIT_USAGE
            if args.pin_base:
                import docker

                client = docker.from_env()
                # Any: types-docker declares an image's id `str | None`; the engine always sets it.
                img: Any = client.images.get(args.pin_base)
                image.pin_base(lock_path, img.id, out)
                print(f"pinned base {args.pin_base} = {img.id} in {out or lock_path}")
            elif args.refresh_packages:
                import docker

                lock = image.load_lock(lock_path)
                versions = image.candidate_versions(docker.from_env(timeout=600), lock)
                changes = image.refresh_packages(lock_path, versions, out)
                for name, (old, new) in sorted(changes.items()):
                    print(f"{name}: {old} -> {new}")
                print(f"kooi image lock: {len(changes)} package pin(s) changed in {out or lock_path}")
            else:
                print("kooi image lock: nothing to do (give --pin-base IMAGE or --refresh-packages)",
                      file=sys.stderr)
                return EXIT_USAGE
    except (image.ImageError, HostStateError) as exc:
        print(f"kooi image {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from . import verify

    unknown = sorted(set(args.check or []) - set(verify.known_ids()))
    if unknown:
        print(f"kooi verify: unknown check id(s) {', '.join(unknown)}; known: {', '.join(verify.known_ids())}",
              file=sys.stderr)
        return EXIT_USAGE
    from .outputs import Output, OutputError

    try:
        # Before the checks (they take a while), not after.
        dest = Output(args.output, "--output") if args.output else None
    except OutputError as exc:
        print(f"kooi verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with dest or contextlib.nullcontext():
        try:
            report = verify.run(args.hosts, args.probe_image, args.check)
        except ImportError:
            print("kooi verify: testinfra is missing (Debian: apt-get install python3-testinfra; "
                  "site.yml installs it)", file=sys.stderr)
            return EXIT_USAGE
        except RuntimeError as exc:  # host not provisioned, unreachable backend
            print(f"kooi verify: {exc}", file=sys.stderr)
            return EXIT_USAGE
        out = {"text": verify.render_text, "json": lambda r: json.dumps(r, indent=2) + "\n",
               "junit": verify.render_junit, "cis": verify.render_cis}[args.format](report)
        if not dest:
            sys.stdout.write(out)
            return EXIT_OK if report["ok"] else EXIT_FAIL
        try:
            dest.write(out)
        except OutputError as exc:
            print(f"kooi verify: {exc}", file=sys.stderr)
            return EXIT_USAGE
    print(verify.render_text(report).splitlines()[-1])
    return EXIT_OK if report["ok"] else EXIT_FAIL


def _apparmor_profiles() -> tuple[str, ...]:
    """kooi's own AppArmor profiles, which the policy lets container creates name."""
    from . import apparmor
    from .hoststate import apparmor as apparmor_state

    try:
        return apparmor.allowed_profiles(apparmor_state.load())
    except HostStateError as exc:
        print(f"kooi: {exc}; no AppArmor profile may be named", file=sys.stderr)
        return ()


def _authz(args: argparse.Namespace) -> int:
    from . import authz
    from .policy import Policy

    if args.action == "health":
        ok, why = authz.health(Path(args.socket))
        print(f"kooi authz: {'healthy' if ok else why}", file=sys.stdout if ok else sys.stderr)
        return EXIT_OK if ok else EXIT_FAIL
    roots = args.workspace_root or []
    for name, value in [("--workspace-root", r) for r in roots] + [("--socket-dir", args.socket_dir)]:
        if value and not os.path.isabs(value):
            print(f"kooi authz: {name} must be an absolute path", file=sys.stderr)
            return EXIT_USAGE
    try:
        token = authz.read_token(Path(args.token_file) if args.token_file else None)
    except OSError as exc:
        print(f"kooi authz: cannot use the token file: {exc}", file=sys.stderr)
        return EXIT_FAIL
    try:
        from .run.limits import host_ceilings

        ceilings = host_ceilings(limits_state.load())
    except HostStateError as exc:
        print(f"kooi authz: {exc}", file=sys.stderr)
        return EXIT_FAIL
    try:
        policy = Policy(workspace=roots[0] if roots else None, extra_workspaces=tuple(roots[1:]),
                        socket_dir=args.socket_dir, apparmor_profiles=_apparmor_profiles(), limits=ceilings,
                        runtimes=tuple(dict.fromkeys(("runc", "io.containerd.runc.v2", *args.runtime))),
                        limits_are="this host's maximum (kooi_workflow_max_limits)")
        authz.serve(Path(args.socket), policy, token=token, group=args.socket_group)
    except KeyboardInterrupt:
        pass
    except (OSError, KeyError) as exc:
        print(f"kooi authz: cannot serve on {args.socket}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _broker_limits(text: str, upstream: str) -> dict[str, int]:
    """--limits: a workflow's `limits` (JSON), the rest the host's defaults, as the
    engine at UPSTREAM bounds them (what kooi run gives a run's broker)."""
    from . import engineapi
    from .run import limits as run_limits
    from .run.container import engine_limits

    try:
        want = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(want, dict) or set(want) - set(limits_state.KEYS):
        raise ValueError(f"expected an object with keys from {', '.join(limits_state.KEYS)}")
    for key, value in want.items():
        if (err := limits_state.value_error(key, value)) is not None:
            raise ValueError(f"{key}: {err}")
    values, origin, errors = limits_state.resolve(want, limits_state.load())
    if errors:
        raise ValueError("; ".join(errors))
    eng = engineapi.Engine(upstream)
    try:
        info = eng.info()
    except engineapi.APIError as exc:
        raise OSError(f"the engine does not answer GET /info: {exc}") from None
    mode = "rootless" if "rootless" in (info.get("SecurityOptions") or [""])[-1] else "rootful"
    plan = run_limits.for_container(values, origin, engine_limits(info), info.get("NCPU"), mode, eng.hard_rlimits())
    return plan.ceilings()


def _broker(args: argparse.Namespace) -> int:
    import signal
    import threading

    from . import broker
    from .policy import Policy

    for name, value in (("--workspace", args.workspace), ("--socket", args.socket)):
        if not os.path.isabs(value):
            print(f"kooi broker: {name} must be an absolute path", file=sys.stderr)
            return EXIT_USAGE
    upstream = args.upstream
    if not upstream:
        try:
            upstream = engine_state.load(Path(args.config)).socket
        except HostStateError as exc:
            print(f"kooi broker: {exc}; or pass --upstream", file=sys.stderr)
            return EXIT_USAGE
    ceilings: dict[str, int] = {}
    if args.limits is not None:
        try:
            ceilings = _broker_limits(args.limits, upstream)
        except (ValueError, OSError) as exc:
            print(f"kooi broker: --limits: {exc}", file=sys.stderr)
            return EXIT_USAGE
    labels = {"org.kooi.managed": "1", "org.kooi.run": args.run_id, "org.kooi.nested": "1"}
    scope = broker.RunScope(args.run_id, labels, network=args.network,
                            path_map={"/workspace": args.workspace} if args.map_workspace else {},
                            limits=dict(ceilings))
    b = broker.Broker(args.socket, upstream, Policy(workspace=args.workspace, limits=dict(ceilings), whole_roots=True),
                      scope,
                      log=lambda m: print(f"kooi broker: {m}", file=sys.stderr, flush=True))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        b.start(mode=int(args.mode, 8))
    except OSError as exc:
        print(f"kooi broker: cannot serve on {args.socket}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(f"kooi broker: serving {args.socket} -> {upstream} (run {args.run_id}, workspace {args.workspace})",
          file=sys.stderr, flush=True)
    stop.wait()
    b.stop()
    if args.cleanup:
        removed = broker.cleanup(upstream, args.run_id)
        print(json.dumps({"broker": b.summary(), "cleanup": removed}), flush=True)
    return EXIT_OK


def _egress(args: argparse.Namespace) -> int:
    from . import egress

    try:
        cfg = egress_state.load(args.egress_config)
    except HostStateError as exc:
        print(f"kooi egress: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if cfg is None:
        print(f"kooi egress: {args.egress_config} not found: egress control is not configured on this host "
              "(roles/egress, kooi_egress_enabled)", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.action == "log":
            try:
                for entry in egress.read_log(cfg, denied_only=args.denied, follow=args.follow):
                    print(json.dumps(entry) if args.json else egress.format_entry(entry), flush=True)
            except PermissionError as exc:
                print(f"kooi egress log: {exc}; the log is readable by root and the proxy's group",
                      file=sys.stderr)
                return EXIT_FAIL
            except KeyboardInterrupt:
                pass
            return EXIT_OK
        if args.action == "proxy-url":
            from . import engine

            ecfg = engine_state.load(args.config)
            host = egress.container_proxy_host(ecfg.mode, engine.client(ecfg, timeout=30))
            print(f"http://{host}:{cfg.port}")
            return EXIT_OK
        if args.action == "start":
            out: dict[str, Any] = egress.start(cfg)
        elif args.action == "stop":
            out = {"stopped": egress.stop(cfg)}
        elif args.action == "reload":
            egress.reload(cfg)
            out = {"reloaded": True}
        else:
            out = egress.status(cfg)
    except (egress.EgressError, HostStateError) as exc:
        print(f"kooi egress {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    if args.action == "status":
        out["rules"]["enforced_for_caller"], out["rules"]["probe"] = egress.rules_enforced(cfg)
    if args.json or args.action != "status":
        print(json.dumps(out, indent=None if args.action != "status" else 2))
    else:
        p, r = out["proxy"], out["rules"]
        print(f"proxy: {'up' if p['up'] else 'DOWN'} ({p['detail']})")
        if "loaded" in r:
            print(f"rules: table {r['table']} {'loaded' if r['loaded'] else 'MISSING'} (from {r['file']})")
        print(f"rules for uid {os.geteuid()}: {'enforced' if r['enforced_for_caller'] else 'not enforced'} "
              f"({r['probe']})")
    if args.action == "status":
        return EXIT_OK if out["proxy"]["up"] and out["rules"].get("loaded", True) else EXIT_NOT_RUNNING
    return EXIT_OK


def _secrets(args: argparse.Namespace) -> int:
    from . import inject

    try:
        cfg = secrets_state.load(args.secrets_config)
    except HostStateError as exc:
        print(f"kooi secrets: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if cfg is None:
        print(f"kooi secrets: {args.secrets_config} not found: this host holds no secrets "
              "(role secrets, kooi_secrets)", file=sys.stderr)
        return EXIT_USAGE if args.action != "status" else EXIT_NOT_RUNNING
    try:
        if args.action == "serve":
            return inject.serve(cfg)
        if args.action == "list":
            out: dict[str, Any] = {n: {"mode": s.mode, "env": s.env, "upstream": s.upstream or None,
                                       "paths": list(s.paths) or None} for n, s in cfg.secrets.items()}
        elif args.action == "start":
            out = {"started": inject.start(cfg)}
        elif args.action == "stop":
            out = {"stopped": inject.stop(cfg)}
        else:
            out = inject.status(cfg)
    except inject.InjectError as exc:
        print(f"kooi secrets {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    if args.json or args.action in ("start", "stop"):
        print(json.dumps(out, indent=2 if args.action in ("status", "list") else None))
    elif args.action == "list":
        for n, d in out.items():
            print(f"{n}: {d['mode']} as ${d['env']}" + (f", to {d['upstream']} {' '.join(d['paths'])}"
                                                      if d["mode"] == "inject" else ""))
    elif out["up"]:
        print(f"injector: up (pid {out['pid']}, uid {out['uid']}, {out['listen']}, {out['runs']} run(s) "
              f"registered; secrets {', '.join(out['secrets']) or 'none'})")
    else:
        print(f"injector: DOWN ({out['detail']})")
    if args.action == "status":
        return EXIT_OK if out["up"] else EXIT_NOT_RUNNING
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kooi", description=__doc__)
    p.add_argument("--version", action="version", version=f"kooi {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("engine", help="start, stop or show the runner's container engine")
    e.add_argument("action", choices=("start", "stop", "status"))
    e.add_argument("--config", default=str(engine_state.PATH),
                   help="host description written by site.yml (default: %(default)s)")
    e.add_argument("--json", action="store_true", help="print the status as JSON")
    e.add_argument("--timeout", type=float, default=90.0,
                   help="seconds to wait for the engine to answer (start)")
    e.set_defaults(func=_engine)

    eg = sub.add_parser("egress", help="the egress proxy and rules: start, stop, reload, status, log")
    eg.add_argument("action", choices=("start", "stop", "reload", "status", "log", "proxy-url"),
                    help="proxy-url: the proxy as a container on the engine's default bridge reaches it")
    eg.add_argument("--config", default=str(engine_state.PATH),
                    help="host description written by site.yml (proxy-url; default: %(default)s)")
    eg.add_argument("--egress-config", default=str(egress_state.PATH),
                    help="egress description written by site.yml (default: %(default)s)")
    eg.add_argument("--json", action="store_true", help="JSON output (log: one object per line)")
    eg.add_argument("--denied", action="store_true", help="log: only refused requests")
    eg.add_argument("--follow", "-f", action="store_true", help="log: keep printing new entries")
    eg.set_defaults(func=_egress)

    sc = sub.add_parser("secrets", help="the secrets a workflow may name and the injector that adds them "
                        "to requests outside the sandbox: list, status, start, stop, serve")
    sc.add_argument("action", choices=("list", "status", "start", "stop", "serve"),
                    help="serve: run the injector in the foreground (root; it drops to its own user)")
    sc.add_argument("--secrets-config", default=str(secrets_state.PATH),
                    help="secrets description written by site.yml (default: %(default)s)")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=_secrets)

    r = sub.add_parser("run", help="run a workflow on this host (for cron and pipelines)",
                       description="Run workflow NAME from /etc/kooi/workflows on a project. Exit code: the "
                       "workload's, or 2 invalid, 75 busy, 124 timeout, 125 engine/image unavailable, "
                       "126 refused by policy, 70 internal error; --json says which (reason).")
    r.add_argument("workflow", help="workflow name (a file NAME.yml in the root-owned workflow directory)")
    r.add_argument("--project", default=os.getcwd(), help="project directory (default: the current one)")
    r.add_argument("--json", metavar="FILE", help="write the JSON result to FILE")
    r.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for a running run of the same workflow on the project (default: fail at once)")
    r.add_argument("--quiet", action="store_true", help="do not echo the workload's output (the log file has it)")
    r.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    r.set_defaults(func=_run)

    g = sub.add_parser("gc", help="remove containers, logs and results that runs left behind")
    g.add_argument("--dry-run", action="store_true")
    g.add_argument("--keep-days", type=float, default=14.0, help="keep logs and results this long")
    g.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    g.set_defaults(func=_gc)

    w = sub.add_parser("workflow", help="validate workflow files")
    wsub = w.add_subparsers(dest="action", required=True)
    wc = wsub.add_parser("check", help="validate workflow files and inline definitions; change nothing")
    wc.add_argument("files", nargs="*", help="workflow files (NAME.yml)")
    wc.add_argument("--name", help="the name a single file will be installed under (default: its file name)")
    wc.add_argument("--inline", metavar="JSON", help="also check a JSON mapping of name to workflow definition")
    wc.add_argument("--source", default="kooi_workflows", help="what to call the --inline mapping in errors")
    wc.add_argument("--secrets", metavar="JSON", help="check secret names against this secrets description "
                    "(the form of /etc/kooi/secrets.json) instead of the host's")
    wc.add_argument("--limits", metavar="JSON", help="check limits against this limits description "
                    "(the form of /etc/kooi/limits.json) instead of the host's")
    wc.set_defaults(func=_workflow_check)

    i = sub.add_parser("image", help="build, verify and pin the runner image")
    i.add_argument("action", choices=("build", "verify", "lock", "save"))
    i.add_argument("--lock", help="the image lock file (build, verify, lock)")
    i.add_argument("--context", help="rendered build context (build)")
    i.add_argument("--name", default="runner", help="pin name in /etc/kooi/images.json")
    i.add_argument("--archive-dir", help="where the base archive named in the lock lies (build)")
    i.add_argument("--check", action="store_true", help="report whether a build is needed, change nothing")
    i.add_argument("--pin-base", metavar="IMAGE", help="lock: pin IMAGE's id as the base")
    i.add_argument("--refresh-packages", action="store_true",
                   help="lock: pin the Debian versions the pinned base's sources offer now")
    i.add_argument("--prebuilt", metavar="ARCHIVE",
                   help="build: load this `kooi image save` archive instead of building, when the engine has "
                        "no image of these inputs (it must be built from the same inputs; verified as a build)")
    i.add_argument("--out", help="lock: write the updated lock here instead of in place; save: the archive")
    i.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    i.set_defaults(func=_image)

    v = sub.add_parser("verify", help="run kooi's check catalogue against a host and report",
                       description="Exit 0 when no check fails, 1 when one does, 2 on usage errors.")
    v.add_argument("--hosts", default="local://", help="testinfra host spec: local://, ssh://user@host, docker://NAME")
    v.add_argument("--format", choices=("text", "json", "junit", "cis"), default="text",
                   help="text (per check), json (docs/verify.schema.json), junit, cis (per CIS Docker Benchmark item)")
    v.add_argument("--output", help="write the report here (stdout gets the summary line)")
    v.add_argument("--probe-image", help="image for the ESC-* probes (default: the pinned runner image)")
    v.add_argument("--check", action="append", metavar="ID", help="run only this check (repeatable)")
    v.set_defaults(func=_verify)

    a = sub.add_parser("authz", help="serve or check the Docker authorization plugin (kooi's request policy)",
                       description="serve: the plugin, until interrupted. health: exit 0 if the plugin "
                       "answers as dockerd expects, 1 (with the reason) if not.")
    a.add_argument("action", choices=("serve", "health"))
    a.add_argument("--socket", default=paths.AUTHZ_SOCKET,
                   help="plugin socket; dockerd finds it by name in /run/docker/plugins (default: %(default)s)")
    a.add_argument("--workspace-root", action="append", default=None,
                   help="bind mounts must resolve below this directory (repeatable; default: no bind mounts)")
    a.add_argument("--socket-dir", default=None,
                   help="sockets directly in this directory may be mounted (kooi run's brokers)")
    a.add_argument("--socket-group", default=None,
                   help="group that may connect (the engine socket's group: health checks as the runner)")
    a.add_argument("--runtime", action="append", default=[], metavar="NAME",
                   help="a further OCI runtime containers may name, besides runc (repeatable; roles/gvisor: runsc)")
    a.add_argument("--token-file", default=None,
                   help="root-only file with the operator token: requests carrying it (header "
                   "X-Kooi-Token; site.yml's image builds) are allowed")
    a.set_defaults(func=_authz)

    b = sub.add_parser("broker", help="serve a policed engine socket for one run (kooi run does this itself)",
                       description="Serve the request policy, labels and ownership rules of one run on a unix "
                       "socket in front of the runner's engine until SIGTERM. `kooi run` starts one per "
                       "testcontainers workflow; this command is for debugging and tests.")
    b.add_argument("action", choices=("serve",))
    b.add_argument("--socket", required=True, help="the socket to serve (created 0660 unless --mode)")
    b.add_argument("--workspace", required=True, help="bind mounts must resolve below this directory")
    b.add_argument("--run-id", required=True, help="label value for everything created through the broker")
    b.add_argument("--upstream", help="the engine's socket (default: the runner's, from --config)")
    b.add_argument("--network", help="network for containers that name none (default: the engine's)")
    b.add_argument("--map-workspace", action="store_true",
                   help="translate bind sources under /workspace to --workspace (as in a run)")
    b.add_argument("--mode", default="660", help="socket permissions, octal (default: %(default)s)")
    b.add_argument("--cleanup", action="store_true",
                   help="on exit, remove everything labelled with the run id and print a JSON summary")
    b.add_argument("--limits", metavar="JSON", help="the run's limits, as a workflow's `limits` (the rest: the "
                   "host's defaults): forced on containers that name none, refused above")
    b.add_argument("--config", default=str(engine_state.PATH), help=argparse.SUPPRESS)
    b.set_defaults(func=_broker)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
