"""The test suite's zygote (tests/support/zygote.py): forked workers answer as
`subprocess.Popen` would, start in milliseconds, and never outlive the zygote."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.zygote import Zygote


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote(preload=("json",))
    yield z
    z.close()


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_worker_runs_as_a_script_would(zygote: Zygote, tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        print("argv", sys.argv[1:], __name__, flush=True)
        line = sys.stdin.readline()
        print("got", line.strip(), flush=True)
        print("to stderr", file=sys.stderr)
        sys.exit(3)
        """,
    )
    proc = zygote.spawn([script, "a", "b"])
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == "argv ['a', 'b'] __main__\n"
    proc.stdin.write("hello\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=10)
    assert (proc.returncode, out, err) == (3, "got hello\n", "to stderr\n")


def test_an_error_is_a_traceback_and_status_1(zygote: Zygote, tmp_path: Path) -> None:
    proc = zygote.spawn([_script(tmp_path, "raise ValueError('boom')\n")])
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "Traceback" in err and "ValueError: boom" in err


def test_signals_and_bounded_waits(zygote: Zygote, tmp_path: Path) -> None:
    proc = zygote.spawn([_script(tmp_path, "import time\ntime.sleep(60)\n")])
    assert proc.poll() is None
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.3)
    assert time.monotonic() - started < 0.3 + 2.0
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    proc.kill()  # after its exit: nothing to signal, no error
    assert proc.communicate(timeout=10) == ("", "")


def test_workers_end_with_the_zygote(tmp_path: Path) -> None:
    z = Zygote(preload=())
    proc = z.spawn([_script(tmp_path, "import time\ntime.sleep(60)\n")])
    z.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the worker outlived its zygote")
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        assert stream is not None
        stream.close()


def test_lines_that_come_together_are_each_read_in_time(zygote: Zygote, tmp_path: Path) -> None:
    """Two lines in one write: the second is there for the next `readline` at once (a
    buffered reader's ``select`` would wait for more and miss it)."""
    script = _script(tmp_path, "import sys, time\nprint('a\\nb', flush=True)\ntime.sleep(60)\n")
    proc = zygote.spawn([script])
    assert proc.readline(10) == "a\n"
    started = time.monotonic()
    assert proc.readline(5) == "b\n"
    assert time.monotonic() - started < 1.0
    assert proc.readline(0.2) == ""  # nothing more within the time
    proc.kill()
    assert proc.communicate(timeout=10) == ("", "")
