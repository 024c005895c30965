#!/usr/bin/env python
"""Run every ``benchmarks/bench_*.py`` and print what each prints.

By default each runs with ``--quick`` (a small, CI-scale run) when its source
mentions that flag, else with no argument. ``--full`` runs each with its own
defaults (the figures of record: tens of minutes). Each script runs in its own
process with this interpreter and the repository's packages on PYTHONPATH.

Usage::

    python benchmarks/run_all.py                 # quick runs (about a minute)
    python benchmarks/run_all.py --full          # full runs
    python benchmarks/run_all.py --only broker   # scripts whose name contains "broker"
    python benchmarks/run_all.py --list
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def discover(only: Sequence[str]) -> list[Path]:
    scripts = sorted(HERE.glob("bench_*.py"))
    if only:
        scripts = [s for s in scripts if any(o in s.stem for o in only)]
    return scripts


def arguments(script: Path, full: bool) -> list[str]:
    if full:
        return []
    try:
        text = script.read_text()
    except OSError:
        return []
    return ["--quick"] if "--quick" in text else []


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="run each script with its full defaults")
    ap.add_argument("--only", action="append", default=[],
                    help="run only scripts whose name contains this (repeatable)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per script (default: 600 quick, 3600 full)")
    ap.add_argument("--list", action="store_true", help="list the scripts and exit")
    args = ap.parse_args(argv)
    scripts = discover(args.only)
    if args.list or not scripts:
        for s in scripts:
            print(f"{s.relative_to(ROOT)} {' '.join(arguments(s, args.full))}".rstrip())
        if not scripts:
            print("no benchmarks/bench_*.py found", file=sys.stderr)
            return 1
        return 0
    timeout = args.timeout or (3600.0 if args.full else 600.0)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    summary = []
    for script in scripts:
        cmd = [sys.executable, str(script.relative_to(ROOT)), *arguments(script, args.full)]
        print(f"\n# {' '.join([Path(sys.executable).name, *cmd[1:]])}\n", flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code = -1
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = f"timed out after {timeout:g} s"
        seconds = time.monotonic() - t0
        print(out.rstrip(), flush=True)
        if code != 0:
            tail = "\n".join(err.rstrip().splitlines()[-30:])
            print(f"\n**{script.name} failed (exit {code})**\n```\n{tail}\n```", flush=True)
        summary.append((script.name, "ok" if code == 0 else f"FAILED ({code})", seconds))
    print("\n# Summary\n")
    print("| script | result | seconds |\n|---|---|---|")
    for name, result, seconds in summary:
        print(f"| {name} | {result} | {seconds:.0f} |")
    return 0 if all(r == "ok" for _, r, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
