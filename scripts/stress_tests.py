"""Run the test suite several times while other processes keep every core busy.

The suite's bounds are real deadlines on real sockets; this is how we check that their
margins hold on a loaded CI runner, not only on an idle laptop::

    make test-stress                    # 5 runs, one busy loop per core
    .venv/bin/python scripts/stress_tests.py --runs 3 -- -m "not slow"

Each run is the suite as `make test` runs it (pytest-xdist, 8 workers), bounded by
``--timeout`` seconds. The busy loops are started before the first run and ended (by their
pids) after the last, whatever happens. Prints one line per run and the tests that failed in
any run (each run's whole output is kept in a temporary directory); exits 1 if any run
failed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that each keep one core busy until they are killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_once(
    pytest_args: list[str], timeout: float, log: Path
) -> tuple[bool, float, list[str], str]:
    """One run of the suite, its output kept in ``log``: passed, seconds, failed test ids,
    the summary line."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    start = time.monotonic()
    # Its own process group, so that the run and its xdist workers end together whatever
    # ends this script (a timeout, Ctrl-C, SIGTERM).
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # As `make test`: compiled and rewritten modules cached in __pycache__.
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        log.write_text(out)
        return False, time.monotonic() - start, FAILED.findall(out), f"timed out after {timeout}s"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    elapsed = time.monotonic() - start
    log.write_text(out)
    lines = out.strip().splitlines()
    summary = lines[-1] if lines else f"exit {proc.returncode}"
    return proc.returncode == 0, elapsed, FAILED.findall(out), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of the suite (default 5)")
    parser.add_argument(
        "--burners",
        type=int,
        default=os.cpu_count() or 2,
        help="busy-loop processes (default: one per core)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run (900)")
    parser.add_argument(
        "pytest_args",
        nargs="*",
        help="after --: arguments for pytest (default: -n 8 --dist worksteal, as make test)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.burners < 0 or args.timeout <= 0:
        parser.error("--runs must be >= 1, --burners >= 0, --timeout > 0")
    pytest_args = args.pytest_args or ["-n", "8", "--dist", "worksteal"]
    failures: dict[str, int] = {}
    passed = 0
    # SIGTERM ends the script through its `finally`, as Ctrl-C does: no busy loop outlives it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    logs = Path(tempfile.mkdtemp(prefix="stallproof-stress-"))
    print(f"each run's output: {logs}/run-N.log")
    busy = burners(args.burners)
    try:
        for i in range(1, args.runs + 1):
            log = logs / f"run-{i}.log"
            ok, elapsed, failed, summary = run_once(pytest_args, args.timeout, log)
            passed += ok
            for test in failed:
                failures[test] = failures.get(test, 0) + 1
            print(f"run {i}/{args.runs}: {'ok  ' if ok else 'FAIL'} {elapsed:6.1f}s  {summary}")
            sys.stdout.flush()
    finally:
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()
    print(f"{passed}/{args.runs} runs passed with {args.burners} busy loops")
    for test, count in sorted(failures.items()):
        print(f"  failed {count}x: {test}")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
