"""lifeline.exit_promptly: a child that skips the interpreter's teardown still exits as sys.exit would for what
anyone can see: its exit code, its buffered output, its exit handlers, a thread that is still working."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_the_exit_code_buffered_output_and_exit_handlers_survive(tmp_path):
    done = _python("""
        import atexit, sys
        from membench.launch.lifeline import exit_promptly
        atexit.register(lambda: print("handler ran", file=sys.stderr))
        sys.stdout.write("buffered, no newline")  # a pipe: block-buffered until flushed
        exit_promptly(5)
        print("never", file=sys.stderr)
    """, tmp_path)
    assert done.returncode == 5
    assert done.stdout == "buffered, no newline"
    assert done.stderr == "handler ran\n"


def test_a_thread_that_is_not_a_daemon_is_waited_for(tmp_path):
    done = _python("""
        import threading, time
        from pathlib import Path
        from membench.launch.lifeline import exit_promptly
        started = threading.Event()
        def work():
            started.set()
            time.sleep(0.5)
            Path("written").write_text("yes")
        threading.Thread(target=work).start()
        started.wait()
        exit_promptly(0)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "written").read_text() == "yes"
