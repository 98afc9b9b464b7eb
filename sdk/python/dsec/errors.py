"""Exceptions: every libdsec failure is a DSecError carrying the stable code
name (err.h / docs/protocol.md), its number, errno and whether a retry is safe."""
from . import _lib

# code number -> name, from the library itself (the names are stable: they travel on the wire)
CODES = {}
for _n in range(1, 64):
    _name = _lib.code_name(_n).decode()
    if _name in CODES.values() or _name in ("unknown", "?"):
        break
    CODES[_n] = _name


class DSecError(Exception):
    """A failed dsec operation.

    code: the stable code name ("timeout", "not_found", ...); code_num: its
    number; retry_safe: whether repeating the request can do no harm (creates
    are idempotent through their request id); errnum: errno or 0; op: the SDK
    operation that failed."""

    code = None

    def __init__(self, message, code="internal", code_num=None, retry_safe=False, errnum=0,
                 op=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.code_num = code_num
        self.retry_safe = retry_safe
        self.errnum = errnum
        self.op = op

    def __str__(self):
        return "%s (%s%s)" % (self.message, self.code, ", retry-safe" if self.retry_safe else "")


class InvalidArgument(DSecError):
    pass


class Timeout(DSecError):
    pass


class ConnectionFailed(DSecError):
    pass


class NotFound(DSecError):
    pass


class AlreadyExists(DSecError):
    pass


class CapacityError(DSecError):
    pass


class NotSupported(DSecError):
    pass


class StateError(DSecError):
    pass


class Closed(DSecError):
    pass


class Diverged(DSecError):
    """A rollout step differs from the one its trajectory log holds."""


class BackendError(DSecError):
    pass


class QuotaExceeded(DSecError):
    """The tenant's or one of its projects' quotas has no room for the request."""


class Overloaded(DSecError):
    """The scheduler holds all the work it may; nothing was placed. libdsec has
    already retried it (same req_id) after retry_after_ms until the client's
    timeout would pass; retry_after_ms is the scheduler's last advice."""


_CLASSES = {"invalid": InvalidArgument, "timeout": Timeout, "no_responders": ConnectionFailed,
            "connection": ConnectionFailed, "not_found": NotFound, "exists": AlreadyExists,
            "capacity": CapacityError, "unsupported": NotSupported, "state": StateError,
            "closed": Closed, "diverged": Diverged, "backend": BackendError,
            "quota": QuotaExceeded, "overloaded": Overloaded}


def error_from_code(code_num, message, errnum=0, op=None, retry_after_ms=0):
    name = _lib.code_name(int(code_num)).decode()
    cls = _CLASSES.get(name, DSecError)
    e = cls(message, code=name, code_num=int(code_num),
            retry_safe=bool(_lib.code_retry_safe(int(code_num))), errnum=errnum, op=op)
    e.retry_after_ms = int(retry_after_ms)  # with "overloaded": the scheduler's advice; else 0
    return e


def from_err(err, op=None):
    """A DSecError from a filled dsec_err (the C struct)."""
    msg = err.msg.decode(errors="replace") or _lib.code_name(err.code).decode()
    if op and not msg.startswith(op + ":"):  # libdsec's own checks already name the op
        msg = "%s: %s" % (op, msg)
    return error_from_code(err.code, msg, err.errnum, op, err.retry_after_ms)


def not_supported(message, op=None):
    """The SDK's own "unsupported" error (code 12, not retry-safe)."""
    return error_from_code(12, message, 0, op)


def closed(message, op=None):
    return error_from_code(15, message, 0, op)
