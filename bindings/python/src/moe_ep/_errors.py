"""MoeEpError and the status check that every wrapper goes through."""

from . import _lib


class MoeEpError(RuntimeError):
    """A moe_ep call failed.

    status  -- the moe_ep_status_t (int), e.g. moe_ep.ERROR_INVALID_ARGUMENT
    name    -- its name, e.g. "MOE_EP_ERROR_INVALID_ARGUMENT"
    message -- moe_ep_last_error() of the failing call: names the argument,
               the expected and the actual value
    """

    def __init__(self, status, message):
        self.status = int(status)
        self.message = message
        self.name = status_string(self.status)
        super().__init__(f"{self.name}: {message}")

    def __reduce__(self):  # picklable (e.g. to send over mpi4py)
        return (MoeEpError, (self.status, self.message))


def status_string(status):
    """Static name of a status, as moe_ep_status_string returns it."""
    return _lib.lib().moe_ep_status_string(int(status)).decode()


def check(status, what=None):
    """Raises MoeEpError unless status is SUCCESS.  The message is read right
    away: moe_ep_last_error() is thread-local and overwritten by the next call
    on this thread.  `what` replaces it for libraries that do not set it (the
    MPI adapter)."""
    if status == _lib.SUCCESS:
        return
    if what is None:
        what = _lib.lib().moe_ep_last_error().decode(errors="replace")
    raise MoeEpError(status, what)
