"""Fleet handling: a tenant's sandboxes listed from the nodes, removed by label, and its
lifecycle events followed (ctypes over client/fleet.c; see docs/sdk.md, "Fleet").

    with DSecClient(tenant="acme") as c:
        for s in c.list(label={"run": "exp-7"}, state="running"):
            print(s.id, s.node, s.labels)
        destroyed, failed = c.remove(label={"run": "exp-7"})
        with c.events() as ev:
            for e in ev:
                print(e.id, e.prev, "->", e.state)

The C layouts of the fleet section of include/dsec/client.h live here, beside their only
user, rather than in _lib.
"""
import ctypes
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int, c_size_t, c_uint32,
                    c_uint64, c_void_p)
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from . import _lib, errors

LIMIT_DEFAULT = 1000
LIMIT_MAX = 10000
STATES = ("requested", "starting", "running", "paused", "stopping")


class _ListOpts(Structure):
    _fields_ = [("labels", POINTER(c_char_p)), ("state", c_char_p), ("type", c_char_p),
                ("limit", c_uint32), ("cursor", c_char_p), ("timeout_ms", c_int)]


class _ListEntry(Structure):
    _fields_ = [("id", c_char * _lib.ID_MAX), ("type", c_char * 32), ("state", c_char * 16),
                ("node", c_char * _lib.NAME_MAX), ("project", c_char * _lib.NAME_MAX),
                ("labels", POINTER(c_char_p)), ("nlabels", c_size_t), ("created_ns", c_uint64),
                ("expires_ns", c_uint64), ("cpu_milli", c_uint64), ("memory_mb", c_uint64)]


class _ListPage(Structure):
    _fields_ = [("entries", POINTER(_ListEntry)), ("n", c_size_t),
                ("next_cursor", c_char * _lib.ID_MAX), ("missing", POINTER(c_char_p)),
                ("nmissing", c_size_t), ("nodes_asked", c_size_t), ("nodes_answered", c_size_t)]


class _SbxEvent(Structure):
    _fields_ = [("id", c_char * _lib.ID_MAX), ("state", c_char * 16), ("prev", c_char * 16),
                ("node", c_char * _lib.NAME_MAX), ("type", c_char * 32), ("reason", c_char * 128),
                ("ts_ns", c_uint64)]


_EVENT_CB = CFUNCTYPE(None, POINTER(_SbxEvent), c_void_p)

_HAVE = hasattr(_lib.lib, "dsec_list_sandboxes")
if _HAVE:
    _list = _lib._proto("dsec_list_sandboxes", c_int, _lib.P, POINTER(_ListOpts),
                        POINTER(_ListPage), _lib.PErr)
    _page_release = _lib._proto("dsec_list_page_release", None, POINTER(_ListPage))
    _watch = _lib._proto("dsec_watch_events", c_int, _lib.P, _EVENT_CB, c_void_p,
                         POINTER(c_void_p), _lib.PErr)
    _watch_free = _lib._proto("dsec_event_watch_free", None, c_void_p)


def _check():
    if not _HAVE:
        raise errors.not_supported("fleet: %s has no dsec_list_sandboxes: rebuild it" % _lib.path,
                                   "list")


@dataclass
class ListedSandbox:
    """One sandbox as its node listed it."""
    id: str
    type: str
    state: str
    node: str
    labels: Dict[str, str] = field(default_factory=dict)
    project: str = ""
    created_ns: int = 0
    expires_ns: int = 0  # 0: no lifetime limit
    cpu_milli: int = 0
    memory_mb: int = 0


@dataclass
class Page:
    """One page of a listing. next_cursor is "" on the last page. missing names the nodes
    (and "cell:NAME") that did not answer in time: the page may lack their sandboxes."""
    items: List[ListedSandbox]
    next_cursor: str
    missing: List[str]
    nodes_asked: int
    nodes_answered: int


def _label_list(label):
    if label is None:
        return None
    if isinstance(label, Mapping):
        return ["%s=%s" % (k, v) for k, v in label.items()]
    return [str(x) for x in label]  # already "k=v" strings: libdsec checks them


def _invalid(msg):
    return errors.error_from_code(1, msg, op="list")


def list_page(client, label=None, state: Optional[str] = None, type: Optional[str] = None,
              limit: int = LIMIT_DEFAULT, cursor: Optional[str] = None,
              timeout_ms: int = 0) -> Page:
    """One page of this client's tenant's sandboxes matching every label (a dict, or "k=v"
    strings), state and type, sorted by id, at most limit (1..10000), after cursor."""
    _check()
    if limit is None or int(limit) < 1 or int(limit) > LIMIT_MAX:
        raise _invalid("list: limit %r: give 1..%d" % (limit, LIMIT_MAX))
    labels = _lib.strv(_label_list(label))
    o = _ListOpts(labels=labels, state=_lib.cstr(state), type=_lib.cstr(type),
                  limit=int(limit), cursor=_lib.cstr(cursor), timeout_ms=int(timeout_ms))
    p = _ListPage()
    client._call("list", _list, ctypes.byref(o), ctypes.byref(p))
    try:
        items = []
        for i in range(p.n):
            e = p.entries[i]
            lab = {}
            for j in range(e.nlabels):
                k, _, v = e.labels[j].decode(errors="replace").partition("=")
                lab[k] = v
            items.append(ListedSandbox(id=e.id.decode(), type=e.type.decode(),
                                       state=e.state.decode(), node=e.node.decode(), labels=lab,
                                       project=e.project.decode(), created_ns=e.created_ns,
                                       expires_ns=e.expires_ns, cpu_milli=e.cpu_milli,
                                       memory_mb=e.memory_mb))
        missing = [p.missing[i].decode() for i in range(p.nmissing)]
        return Page(items=items, next_cursor=p.next_cursor.decode(), missing=missing,
                    nodes_asked=p.nodes_asked, nodes_answered=p.nodes_answered)
    finally:
        _page_release(ctypes.byref(p))


class SandboxList:
    """Iterates every match, page by page (page_size per request). After (or during) the
    walk, missing holds every node that did not answer some page: when it is not empty the
    walk may have skipped sandboxes. strict=True raises Timeout instead."""

    def __init__(self, client, label=None, state=None, type=None, page_size=LIMIT_DEFAULT,
                 cursor=None, timeout_ms=0, strict=False):
        if page_size is None or int(page_size) < 1 or int(page_size) > LIMIT_MAX:
            raise _invalid("list: page_size %r: give 1..%d" % (page_size, LIMIT_MAX))
        self._client = client
        self._kw = dict(label=label, state=state, type=type, limit=int(page_size),
                        timeout_ms=timeout_ms)
        self._cursor = cursor
        self._strict = strict
        self.missing: List[str] = []

    def __iter__(self) -> Iterator[ListedSandbox]:
        cursor = self._cursor
        while True:
            p = list_page(self._client, cursor=cursor, **self._kw)
            for m in p.missing:
                if m not in self.missing:
                    self.missing.append(m)
            if p.missing and self._strict:
                raise errors.error_from_code(
                    4, "list: node(s) %s did not answer: the listing may be short"
                    % ", ".join(p.missing), op="list")
            yield from p.items
            if not p.next_cursor:
                return
            cursor = p.next_cursor


def remove(client, label, state: Optional[str] = None, type: Optional[str] = None,
           workers: int = 16) -> Tuple[int, Dict[str, str]]:
    """Destroy every sandbox of this tenant matching label (required: a dict or "k=v"
    strings), state and type, workers at a time, listing again until none match (at most 5
    rounds). Returns (destroyed, {id: why} of those that could not be). A node that did not
    answer the last listing raises Timeout: its sandboxes were not seen."""
    if not label:
        raise _invalid("remove: give at least one label")
    destroyed = 0
    failed: Dict[str, str] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, int(workers)), thread_name_prefix="dsec-rm")
    try:
        for _ in range(5):
            lst = SandboxList(client, label=label, state=state, type=type, page_size=LIMIT_MAX)
            ids = [s.id for s in lst]
            if not ids:
                failed = {}
                break

            def one(i):
                try:
                    client._call("destroy", _lib.destroy, i.encode())
                    return i, None
                except errors.NotFound:
                    return i, None
                except errors.DSecError as e:
                    return i, str(e)
            failed = {}
            for i, why in pool.map(one, ids):
                if why is None:
                    destroyed += 1
                else:
                    failed[i] = why
        if lst.missing:
            raise errors.error_from_code(
                4, "remove: node(s) %s did not answer: their sandboxes were not seen (destroyed "
                "%d)" % (", ".join(lst.missing), destroyed), op="remove")
    finally:
        pool.shutdown(wait=True)
    return destroyed, failed


@dataclass
class SandboxEvent:
    """One lifecycle transition of one of the tenant's sandboxes."""
    id: str
    state: str
    prev: str
    node: str
    type: str
    reason: str
    ts_ns: int


class EventStream:
    """This tenant's sandbox lifecycle events from now on (dsec.v1.<tenant>.evt.sbx).
    Iterate it (blocks for the next event), or call get(timeout). close() (or leaving a
    with block) stops it; close it before the client."""

    def __init__(self, client):
        _check()
        self._q: "queue.Queue" = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()

        def cb(ev, ud):
            e = ev.contents
            self._q.put(SandboxEvent(id=e.id.decode(), state=e.state.decode(),
                                     prev=e.prev.decode(), node=e.node.decode(),
                                     type=e.type.decode(),
                                     reason=e.reason.decode(errors="replace"), ts_ns=e.ts_ns))
        self._cb = _EVENT_CB(cb)  # kept alive as long as the watch
        self._h = c_void_p()
        client._call("events", _watch, self._cb, None, ctypes.byref(self._h))

    def get(self, timeout: Optional[float] = None) -> Optional[SandboxEvent]:
        """The next event, or None after timeout seconds without one."""
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def __iter__(self):
        return self

    def __next__(self) -> SandboxEvent:
        while True:
            if self._closed:
                raise StopIteration
            e = self.get(timeout=0.5)
            if e is not None:
                return e

    def close(self) -> None:
        with self._lock:
            h, self._h = self._h, None
            self._closed = True
        if h:
            _watch_free(h)  # waits for a callback still running

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
