"""The package's one error type, carrying the C ABI's status code."""

# The status codes of wsup_client.h (wsup_status), by value.
OK = 0
INVALID_ARGUMENT = 1
NOT_FOUND = 2
IO = 3
CORRUPT = 4
REFUSED = 5
MISMATCH = 6
TIMEOUT = 7
UNAVAILABLE = 8
INTERNAL = 9

CODE_NAMES = {
    OK: "ok",
    INVALID_ARGUMENT: "invalid_argument",
    NOT_FOUND: "not_found",
    IO: "io",
    CORRUPT: "corrupt",
    REFUSED: "refused",
    MISMATCH: "mismatch",
    TIMEOUT: "timeout",
    UNAVAILABLE: "unavailable",
    INTERNAL: "internal",
}


class WsupError(Exception):
    """An error from the holder or the client library.

    `code` is the C ABI's status code (an int, see the constants of this
    module) and `code_name` its name ("mismatch", "unavailable", ...). The
    message names the cause and the fix.
    """

    def __init__(self, message, code=INTERNAL):
        super().__init__(message)
        self.code = code
        self.code_name = CODE_NAMES.get(code, "unknown")


class LibraryNotFoundError(WsupError, OSError):
    """libwsup_client.so could not be found or loaded."""

    def __init__(self, message):
        WsupError.__init__(self, message, NOT_FOUND)


class UnknownTensorError(WsupError, KeyError):
    """A tensor name that the holder's manifest does not have."""

    def __init__(self, message):
        WsupError.__init__(self, message, NOT_FOUND)

    def __str__(self):  # KeyError would show the message quoted
        return self.args[0]
