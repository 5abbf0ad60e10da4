"""moe_ep.Store: the key/value server that survivors of a failure agree
through (failure_policy="mask"; docs/reliability.md, "Surviving a dead rank")."""

import ctypes

from . import _lib
from ._errors import MoeEpError, check


class Store:
    """A moe_ep store served on threads of this process (moe_ep_store_serve)
    until close().  Serve it from a process that outlives the ranks (the
    launcher, an orchestrator): hosted inside a rank it dies with that rank,
    and with it every survivor's MASK handle.  It has no authentication: bind
    it to an address only the job reaches.

        with moe_ep.Store("127.0.0.1", 0) as store:   # port 0: any free port
            ... MoeEp(..., failure_policy="mask", store_address=store.address)

    host: a name or address to listen on, None = every interface.  Not
    collective; the garbage collector may close it."""

    def __init__(self, host=None, port=0):
        if host is not None and not isinstance(host, str):
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"host: expected a str or None, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int):
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"port: expected an int, got {port!r}")
        self.host = host
        self._ptr = _lib.StorePtr()
        check(_lib.lib().moe_ep_store_serve(None if host is None else host.encode(), port,
                                            ctypes.byref(self._ptr)))

    def _live(self):
        if self._ptr.value is None:
            raise MoeEpError(_lib.ERROR_INVALID_STATE, "this moe_ep store was closed")
        return self._ptr

    @property
    def port(self):
        """The port it listens on (the one chosen for port 0)."""
        p = ctypes.c_int32(0)
        check(_lib.lib().moe_ep_store_port(self._live(), ctypes.byref(p)))
        return p.value

    @property
    def address(self):
        """"host:port" for config store_address and StoreBootstrap, with
        127.0.0.1 for a store listening on every interface (ranks on other
        machines use this machine's name instead)."""
        return f"{self.host or '127.0.0.1'}:{self.port}"

    @property
    def closed(self):
        return self._ptr.value is None

    def close(self):
        """Stops the server (a waiting get answers "not found"); idempotent."""
        if getattr(self, "_ptr", None) is not None and self._ptr.value is not None:
            check(_lib.lib().moe_ep_store_destroy(ctypes.byref(self._ptr)))

    destroy = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
