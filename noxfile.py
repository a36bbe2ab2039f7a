"""nox sessions. They use the current interpreter (no per-session virtualenv), so torch is not reinstalled."""

import nox

nox.options.default_venv_backend = "none"


@nox.session
def tests(session):
    """The test suite, as README and .ci/run run it."""
    session.run("python", "-m", "pytest", "-q", *session.posargs)
