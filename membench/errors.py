"""The one exception type for a user's mistake: the CLI prints its message on one line and exits non-zero."""


class UserError(Exception):
    """Bad input from the user (unknown name, impossible combination, missing file). Never a bug in membench."""
