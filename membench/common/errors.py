"""The one exception type for a user's mistake: the CLI prints its message on one line and exits non-zero; and
the one line that says what a user's code raising was."""


class UserError(Exception):
    """Bad input from the user (unknown name, impossible combination, missing file). Never a bug in membench."""


def failure_line(exc: BaseException, workload: str | None) -> str:
    """What the user's code raising is, in one line (also for fit's workers, which run it in processes of their
    own). SystemExit and the like are not membench's exit code."""
    if isinstance(exc, Exception):
        return f"workload {workload!r} raised {type(exc).__name__}: {exc}"
    return (f"workload {workload!r} raised {type(exc).__name__}{'(' + str(exc) + ')' if str(exc) else ''} while "
            "membench ran it")
