"""DSecClient and Sandbox: the blocking interface, and AsyncDSecClient /
AsyncSandbox: the asyncio interface over the same connection.

Blocking calls go straight into libdsec (ctypes releases the GIL for the
call). Asynchronous creates go through a libdsec completion queue per event
loop: the creates asked for during one turn of the loop are sent together
with one dsec_cq_create_batch call at the end of the turn, and the answers
are collected in batches when the queue's eventfd turns readable (no Python
runs on libdsec's threads). The other asynchronous operations run the
blocking call on the client's thread pool.
"""
import asyncio
import collections
import ctypes
import functools
import itertools
import operator
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import AsyncIterator, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import _lib, errors
from .types import (DirEvent, Transfer, ContainerArgs, Data, DirEntry, ExecResult, FunctionArgs, MicroVMArgs,
                    ProcessInfo, ProcessOutput, SandboxArgs, SandboxInfo, VMArgs)

TYPES = ("function", "container", "microvm", "vm", "sim")


def _bytes(data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode()
    return bytes(data)


def _info(ci) -> SandboxInfo:
    return SandboxInfo(id=ci.id.decode(), node=ci.node.decode(), type=ci.type.decode(),
                       state=ci.state.decode(), cell=ci.cell.decode(), existing=bool(ci.existing))


def _invalid(op, message):
    return errors.error_from_code(1, "%s: %s" % (op, message), op=op)


def _net_entries(network, op="create"):
    """The create's net entries: the names network maps to True."""
    if not network:
        return []
    if not isinstance(network, Mapping):
        raise _invalid(op, "network must map rule names to True/False, e.g. "
                       "{\"pypi\": True}; got %s" % type(network).__name__)
    out = []
    for name, allowed in network.items():
        if not isinstance(name, str) or not name or "=" in name:
            raise _invalid(op, "network: rule name %r is not a non-empty string "
                           "without '='" % (name,))
        if not isinstance(allowed, bool):
            raise _invalid(op, "network: rule %r must be True or False, got %r"
                           % (name, allowed))
        if allowed:
            out.append(name)
    return out


def _build_spec(type_: Optional[str], args: SandboxArgs):
    """A dsec_create_spec and the Python objects that keep its pointers alive."""
    keep = []

    def s(v):
        b = _lib.cstr(v)
        keep.append(b)
        return b

    def v(items):
        a = _lib.strv(list(items))
        keep.append(a)
        return a

    spec = _lib.CreateSpec()
    spec.type = s(type_)
    spec.requires = v(args.requires)
    spec.env = s(args.environment)
    spec.cpu_milli = int(round((args.cpu or 0) * 1000))
    spec.memory_mb = int(args.memory_mb or 0)
    spec.disk_mb = int(args.disk_mb or 0)
    spec.ttl_s = int(args.max_lifetime_s or 0)
    spec.idle_s = int(args.idle_timeout_s or 0)
    spec.labels = v("%s=%s" % (k, val) for k, val in (args.labels or {}).items())
    spec.affinity = v("%s=%s" % (k, val) for k, val in (args.affinity or {}).items())
    spec.cell = s(args.cell)
    spec.cls = s(args.cls)
    spec.priority = int(args.priority or 0)
    spec.rollout_id = s(args.rollout_id)
    spec.net = v(_net_entries(args.network))
    spec.req_id = s(args.request_id)
    spec.pausable = bool(args.pausable)
    spec.project = s(args.project)
    return spec, keep


# Specs shared by every create with the same arguments. libdsec borrows a spec
# only during the call that sends it (a retry re-sends the create's own
# encoding, tests/test_control.c async_retry_outlives_the_callers_spec), so
# one struct serves any number of creates. Only specs without labels,
# affinity, network or requires are cached: their key is the scalar fields,
# whose equal values (1 == 1.0 == True) make equal specs.
_SPEC_CACHE_MAX = 256
_spec_cache = {}


# the spec's scalar fields, read in one C call
_spec_key = operator.attrgetter("environment", "memory_mb", "cpu", "disk_mb", "max_lifetime_s",
                                "idle_timeout_s", "cell", "cls", "priority", "rollout_id",
                                "request_id", "pausable", "project")


def _spec(type_: Optional[str], a: SandboxArgs):
    """The CreateSpec of a create (it holds its strings alive itself)."""
    if a.labels or a.affinity or a.network or a.requires:
        return _build_spec(type_, a)[0]
    key = (type_, _spec_key(a))
    try:
        spec = _spec_cache.get(key)
    except TypeError:  # an unhashable field value: build it each time
        return _build_spec(type_, a)[0]
    if spec is None:
        spec = _build_spec(type_, a)[0]
        if len(_spec_cache) >= _SPEC_CACHE_MAX:
            _spec_cache.clear()
        _spec_cache[key] = spec
    return spec


_loops = threading.local()
_get_ident = threading.get_ident


def _running_loop():
    """asyncio.get_running_loop() without its getpid() system call on the
    common path: the loop this thread last used is still the running one
    while it runs in this thread (asyncio's loops record that thread in
    _thread_id; a loop without that attribute always takes the slow path)."""
    loop = getattr(_loops, "loop", None)
    if loop is not None and getattr(loop, "_thread_id", None) == _get_ident():
        return loop
    loop = _loops.loop = asyncio.get_running_loop()
    return loop


def _args(args: Optional[SandboxArgs], cls, kw) -> SandboxArgs:
    if args is None:
        return cls(**kw)
    return replace(args, **kw) if kw else args


# ---- asynchronous create: C callback -> asyncio future ---------------------------------------

_pending = {}          # token -> (bridge, future)
_pending_lock = threading.Lock()
_tokens = itertools.count(1)
_bridges = weakref.WeakKeyDictionary()   # loop -> _Bridge


class _Bridge:
    """Completions for one event loop. libdsec's threads append to a queue and
    wake the loop (call_soon_threadsafe) only when no drain is scheduled yet,
    so a burst of answers costs one wake-up, not one per create."""

    def __init__(self, loop):
        self.loop = loop
        self.lock = threading.Lock()
        self.queue = collections.deque()
        self.scheduled = False

    def push(self, item):
        with self.lock:
            self.queue.append(item)
            if self.scheduled:
                return
            self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self.drain)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for these answers any more

    def drain(self):
        with self.lock:
            items = list(self.queue)
            self.queue.clear()
            self.scheduled = False
        for fut, raw, err in items:
            if fut.cancelled():
                continue
            if err is None:
                fut.set_result(_info(raw))
            else:
                fut.set_exception(errors.from_err(err, "create"))


def _bridge(loop):
    b = _bridges.get(loop)
    if b is None:
        b = _bridges[loop] = _Bridge(loop)
    return b


@_lib.CREATE_CB
def _on_create(status, info, err, ud):
    # On a libdsec thread; info and err are borrowed for this call: copy the
    # structs (one memcpy each) and decode on the loop's thread.
    with _pending_lock:
        entry = _pending.pop(ud or 0, None)
    if entry is None:
        return
    bridge, fut, _ = entry
    if status == 0:
        bridge.push((fut, _lib.SandboxInfo.from_buffer_copy(info.contents), None))
    else:
        bridge.push((fut, None, _lib.Err.from_buffer_copy(err.contents)))


class _CQ:
    """A libdsec completion queue serving one event loop. Creates asked for
    during one turn of the loop are queued here and sent together at the end
    of the turn (one dsec_cq_create_batch call); the queue's eventfd is a
    reader of the loop, and each wake-up collects up to CHUNK answers with
    one call and decodes them in one pass (no Python runs on libdsec's
    threads).

    Why CHUNK and not every queued answer at once: the eventfd stays readable
    while answers are queued (level-triggered), so the rest are collected on
    the next turns, after the tasks woken by this chunk have run. Waking
    hundreds of tasks in one turn costs quadratic time in the common
    trainer pattern `async with asyncio.Semaphore(window)`: each release
    during a turn scans past every waiter already woken in that turn but not
    yet run (CPython's Semaphore._wake_up_next). 32 keeps that scan short
    while a turn still serves many answers."""

    CHUNK = 32

    def __init__(self, client, loop):
        h = ctypes.c_void_p()
        err = _lib.Err()
        if _lib.cq_new(ctypes.byref(h), ctypes.byref(err)) < 0:
            raise errors.from_err(err, "create")
        self.client = weakref.ref(client)  # the client owns its queues, not the reverse
        self.h = h
        self.loop = loop
        self.fd = _lib.cq_fd(h)
        self.futs = {}   # token -> future
        self.next_token = 1  # tokens are per queue: they key futs
        self.chunk = self.CHUNK
        self.buf = (_lib.CqEvent * self.chunk)()
        self.size = ctypes.sizeof(_lib.CqEvent)
        self.err = _lib.Err()
        self.places = {}  # raw node..cell bytes -> (node, type, state, cell) decoded
        self.specs = []  # the turn's creates not sent yet: their specs and futures
        self.waiting = []
        self.flush_scheduled = False
        loop.add_reader(self.fd, self.drain)

    def take_token(self):
        t = self.next_token
        self.next_token = t + 1
        return t

    def submit(self, spec, fut):
        """Queue a create for the end of this turn (loop thread only)."""
        self.specs.append(spec)
        self.waiting.append(fut)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self):
        """Send the creates queued during the turn: one call for all of them.
        A create whose future was cancelled before it was sent is not sent."""
        self.flush_scheduled = False
        specs, waiting = self.specs, self.waiting
        self.specs, self.waiting = [], []
        if any(map(_cancelled, waiting)):
            keep = [i for i, f in enumerate(waiting) if not f.cancelled()]
            specs = [specs[i] for i in keep]
            waiting = [waiting[i] for i in keep]
        n = len(specs)
        if n == 0:
            return
        client = self.client()
        h = client._c if client is not None else None
        if h is None or self.h is None:
            for f in waiting:
                f.set_exception(errors.closed("create: the client was closed before the "
                                              "create was sent", "create"))
            return
        base = self.next_token
        self.next_token = base + n
        tokens = range(base, base + n)
        futs = self.futs
        futs.update(zip(tokens, waiting))
        addrs = (ctypes.c_void_p * n)(*map(ctypes.addressof, specs))
        toks = (ctypes.c_uint64 * n)(*tokens)
        if _lib.cq_create_batch(self.h, h, addrs, toks, n, ctypes.byref(self.err)) < 0:
            for t, f in zip(tokens, waiting):
                del futs[t]
                f.set_exception(errors.from_err(self.err, "create"))
        # every create is now answered through the queue, failures to send included

    def _place(self, raw):
        """(node, type, state, cell) of an answer's raw fields, decoded once
        for all the answers that share them (a trainer's creates mostly land
        on a few nodes, all with the same type, state and cell)."""
        places = self.places
        if len(places) >= 1024:
            places.clear()
        # libdsec zero-fills past each string's end
        p = places[raw] = tuple(raw[a:b].rstrip(b"\0").decode() for a, b in _lib.INFO_PLACE)
        return p

    def drain(self):
        """Collect and answer up to CHUNK queued answers; returns how many."""
        buf = self.buf
        n = _lib.cq_poll(self.h, buf, self.chunk)
        if n == 0:
            return 0
        futs, places, info = self.futs, self.places, SandboxInfo
        for i, (token, status, id_, place, existing) in \
                enumerate(_lib.CQ_EVENT.iter_unpack(ctypes.string_at(buf, n * self.size))):
            fut = futs.pop(token, None)
            if fut is None or fut.cancelled():
                continue
            if status == 0:
                node, type_, state, cell = places.get(place) or self._place(place)
                fut.set_result(info(id_.rstrip(b"\0").decode(), node, type_, state, cell,
                                    existing))
            else:
                fut.set_exception(errors.from_err(buf[i].err, "create"))
        return n

    def detach(self):
        """After the client is freed (every create answered): stop and free."""
        try:
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)
                while self.drain():
                    pass
        except Exception:
            pass
        _lib.cq_free(self.h)
        self.h = None


_cancelled = operator.methodcaller("cancelled")


# ---- the client -------------------------------------------------------------------------------

class DSecClient:
    """A connection to a dsec cell (its NATS bus).

        with DSecClient(url="nats://127.0.0.1:4222") as c:
            sb = c.run_function(FunctionArgs(memory_mb=512, labels={"runtime": "python3"}))
            print(sb.exec(["python3", "-c", "print(6 * 7)"]).text)
            sb.stop()

    url: None means $DSEC_URL, else nats://127.0.0.1:4222. timeout_ms and
    retries apply per request (retry-safe failures are retried with the same
    request id). max_workers bounds the thread pool of the asyncio interface's
    non-create operations.
    """

    def __init__(self, url: Optional[str] = None, tenant: Optional[str] = None,
                 timeout_ms: int = 10000, retries: int = 2, threads: int = 2,
                 name: str = "dsec-python", max_workers: int = 64, open: bool = True):
        self.url = url
        self.tenant = tenant
        self.timeout_ms = timeout_ms
        self.retries = retries
        self.threads = threads
        self.name = name
        self.max_workers = max_workers
        self._c = None
        self._pool = None
        self._cqs = {}
        self._lock = threading.Lock()
        if open:
            self.open()

    # -- lifetime
    def open(self) -> "DSecClient":
        with self._lock:
            if self._c is not None:
                return self
            opts = _lib.ClientOpts(url=_lib.cstr(self.url), tenant=_lib.cstr(self.tenant),
                                   timeout_ms=int(self.timeout_ms),
                                   retries=int(self.retries) if self.retries else -1,
                                   threads=int(self.threads), name=_lib.cstr(self.name))
            h = ctypes.c_void_p()
            err = _lib.Err()
            if _lib.client_connect(ctypes.byref(h), ctypes.byref(opts), ctypes.byref(err)) < 0:
                raise errors.from_err(err, "connect")
            self._c = h
            self._tenant = _lib.client_tenant(h).decode()
        return self

    def close(self) -> None:
        """Finish pending work and disconnect (pending asynchronous creates are
        answered first). Idempotent."""
        with self._lock:
            h, self._c = self._c, None
            pool, self._pool = self._pool, None
            cqs, self._cqs = self._cqs, {}
        if pool is not None:
            pool.shutdown(wait=True)
        if h is not None:
            _lib.client_free(h)  # answers every pending create (into the queues)
        for q in cqs.values():
            q.detach()

    @property
    def closed(self) -> bool:
        return self._c is None

    @property
    def tenant_name(self) -> str:
        return self._handle("tenant") and self._tenant

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self, op):
        h = self._c
        if h is None:
            raise errors.closed("%s: the client is closed (call open() first)" % op, op)
        return h

    def _executor(self):
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_workers,
                                                thread_name_prefix="dsec")
            return self._pool

    def _call(self, op, fn, *args):
        err = _lib.Err()
        if fn(self._handle(op), *args, ctypes.byref(err)) < 0:
            raise errors.from_err(err, op)

    # -- fleet: this tenant's sandboxes, listed from the nodes, removed by label; its events
    # (dsec/fleet.py)
    def list(self, label=None, state=None, type=None, page_size=1000, cursor=None,
             timeout_ms=0, strict=False):
        """Every sandbox of this tenant matching label/state/type, page by page (a
        fleet.SandboxList: iterate it; .missing names nodes that did not answer)."""
        from . import fleet
        return fleet.SandboxList(self, label=label, state=state, type=type, page_size=page_size,
                                 cursor=cursor, timeout_ms=timeout_ms, strict=strict)

    def list_page(self, **kw):
        """One page (fleet.list_page): items, next_cursor, missing."""
        from . import fleet
        return fleet.list_page(self, **kw)

    def remove(self, label, state=None, type=None, workers=16):
        """Destroy every match (fleet.remove): (destroyed, {id: why})."""
        from . import fleet
        return fleet.remove(self, label, state=state, type=type, workers=workers)

    def events(self):
        """This tenant's lifecycle events from now on (a fleet.EventStream)."""
        from . import fleet
        return fleet.EventStream(self)

    # -- create (blocking)
    def run(self, type: Optional[str] = None, args: Optional[SandboxArgs] = None,
            **kw) -> "Sandbox":
        """Create a sandbox of type (function, container, microvm, vm, sim;
        None: the lightest that satisfies args.requires) and wait until it runs."""
        a = _args(args, SandboxArgs, kw)
        spec, keep = _build_spec(type, a)
        out = _lib.SandboxInfo()
        self._call("create", _lib.create, ctypes.byref(spec), ctypes.byref(out))
        return Sandbox(self, _info(out), user=a.user, rollout_id=a.rollout_id)

    def run_function(self, args: Optional[FunctionArgs] = None, **kw) -> "Sandbox":
        return self.run("function", _args(args, FunctionArgs, kw))

    def run_container(self, args: Optional[ContainerArgs] = None, **kw) -> "Sandbox":
        """Create a container on args.environment (an environment of the
        cell's layer registry) and wait until it runs; see ContainerArgs."""
        return self.run("container", _args(args, ContainerArgs, kw))

    def run_microvm(self, args: Optional[MicroVMArgs] = None, **kw) -> "Sandbox":
        return self.run("microvm", _args(args, MicroVMArgs, kw))

    def run_vm(self, args: Optional[VMArgs] = None, **kw) -> "Sandbox":
        return self.run("vm", _args(args, VMArgs, kw))

    def sandbox(self, id: str, user: Optional[str] = None,
                rollout_id: Optional[str] = None) -> "Sandbox":
        """A handle on an existing sandbox (e.g. after a trainer restart)."""
        info = SandboxInfo(id=id, node=id.rsplit("-", 1)[0], type="", state="", cell="")
        return Sandbox(self, info, user=user, rollout_id=rollout_id)

    # -- create (asynchronous, one future per create)
    def create_future(self, type: Optional[str], args: SandboxArgs,
                      loop: Optional[asyncio.AbstractEventLoop] = None) -> "asyncio.Future":
        """Start a create and return an asyncio future of its SandboxInfo;
        must be called from the loop's thread. The create is sent at the end
        of the loop's current turn, with every other create asked for during
        it. Bad arguments raise here; every failure after that (the cell's
        answer, or a create that could not be sent) is the future's
        exception."""
        if loop is None:
            loop = _running_loop()
        fut = loop.create_future()
        spec = _spec(type, args)
        h = self._handle("create")
        if _lib.HAVE_CQ:
            q = self._cqs.get(loop)
            if q is None:
                with self._lock:
                    q = self._cqs.get(loop)
                    if q is None:
                        q = self._cqs[loop] = _CQ(self, loop)
            if _lib.HAVE_CQ_BATCH:
                q.submit(spec, fut)
                return fut
            # a libdsec without the batch call: one dsec_create_cq per create
            token = q.take_token()
            err = _lib.Err()
            q.futs[token] = fut  # libdsec encodes the spec during the call
            if _lib.create_cq(h, ctypes.byref(spec), q.h, token, ctypes.byref(err)) < 0:
                q.futs.pop(token, None)
                fut.set_exception(errors.from_err(err, "create"))
            return fut
        # an older libdsec without completion queues: its callback, bridged
        token = next(_tokens)
        err = _lib.Err()
        with _pending_lock:
            _pending[token] = (_bridge(loop), fut, spec)
        if _lib.create_async(h, ctypes.byref(spec), _on_create, ctypes.c_void_p(token),
                             ctypes.byref(err)) < 0:
            with _pending_lock:
                _pending.pop(token, None)
            fut.set_exception(errors.from_err(err, "create"))
        return fut

    def aio(self) -> "AsyncDSecClient":
        """The asyncio interface over this connection."""
        return AsyncDSecClient(client=self)


def _transfer(r) -> Transfer:
    return Transfer(size=r.size, sha256=r.sha256.decode(), upload_id=r.upload_id.decode(),
                    resumed_from=r.resumed_from)


class Files:
    """sandbox.files: read, write, list, upload, download, mkdir, stat, rename and remove
    files in the sandbox."""

    def __init__(self, sb: "Sandbox"):
        self._sb = sb

    def write(self, path: str, data: Data, mode: int = 0o644, append: bool = False,
              step: Optional[int] = None, rollout_id: Optional[str] = None) -> None:
        """Write (or append) data of any size to path (sent in 4 MiB messages).
        With step, the write is recorded in the rollout's trajectory log and a
        re-issued step is never repeated; such a write holds at most 4 MiB."""
        sb = self._sb
        buf = _bytes(data)
        rid = rollout_id or sb.rollout_id if step is not None else None
        opts = _lib.WriteOpts(mode=mode, append=append, rollout_id=_lib.cstr(rid),
                              step=int(step or 0))
        sb._client._call("files.write", _lib.file_write_ex, sb._cid, _lib.cstr(path), buf,
                         len(buf), ctypes.byref(opts))

    def read(self, path: str) -> bytes:
        """The whole file, of any size (fetched in 4 MiB pages). A file that
        changes size while it is read raises StateError: read it again."""
        sb = self._sb
        p = ctypes.POINTER(ctypes.c_uint8)()
        n = ctypes.c_size_t()
        sb._client._call("files.read", _lib.file_read, sb._cid, _lib.cstr(path), ctypes.byref(p),
                         ctypes.byref(n))
        try:
            return ctypes.string_at(p, n.value) if n.value else b""
        finally:
            _lib.free(p)

    def upload(self, path: str, src, mode: int = 0, upload_id: Optional[str] = None,
               resume: bool = False, chunk_size: int = 0, window: int = 0) -> Transfer:
        """Stream src (bytes or str, or a file-like object with read(n)) to path, of any
        size: a few chunks in flight into a hidden temporary file next to path, which
        replaces path at once when all of it arrived and its sha256 matched. mode 0: the
        mode of the file replaced, or 0644. After a failure, call again with the same
        upload_id (the error and Transfer name it), resume=True and the source from its
        start: what the sandbox holds is not sent again."""
        sb = self._sb
        if isinstance(src, (bytes, bytearray, memoryview, str)):
            import io
            src = io.BytesIO(_bytes(src))
        failure = []

        def read(_ud, buf, n):
            try:
                b = src.read(n)
                if isinstance(b, str):
                    b = b.encode()
                k = len(b)
                if k > n:
                    raise ValueError("read(%d) returned %d bytes" % (n, k))
                ctypes.memmove(buf, b, k)
                return k
            except BaseException as e:  # noqa: B902 (carried out of the C call)
                failure.append(e)
                return -1

        cb = _lib.UPLOAD_READ(read)
        opts = _lib.UploadOpts(mode=mode, upload_id=_lib.cstr(upload_id), resume=resume,
                               chunk=int(chunk_size), window=int(window))
        res = _lib.TransferResult()
        try:
            sb._client._call("files.upload", _lib.file_upload, sb._cid, _lib.cstr(path),
                             ctypes.byref(opts), cb, None, ctypes.byref(res))
        except Exception:
            if failure:
                raise failure[0]
            raise
        return _transfer(res)

    def upload_held(self, path: str, upload_id: str) -> int:
        """How many bytes the sandbox holds for upload_id's upload to path (0: none)."""
        sb = self._sb
        n = ctypes.c_uint64()
        sb._client._call("files.upload_held", _lib.file_upload_held, sb._cid, _lib.cstr(path),
                         _lib.cstr(upload_id), ctypes.byref(n))
        return n.value

    def download(self, path: str, dst=None, page_size: int = 0, window: int = 0):
        """Stream path into dst (a file-like object with write(b)) page by page, a few pages
        in flight; the sha256 of what arrived must equal the sandbox's (else BackendError:
        read it again). Returns a Transfer; with dst None, the bytes instead."""
        sb = self._sb
        import io
        sink = io.BytesIO() if dst is None else dst
        failure = []

        def page(_ud, data, n, _size):
            try:
                if n:
                    sink.write(ctypes.string_at(data, n))
                return 0
            except BaseException as e:  # noqa: B902
                failure.append(e)
                return -1

        cb = _lib.PAGE_FN(page)
        opts = _lib.DownloadOpts(page=int(page_size), window=int(window))
        res = _lib.TransferResult()
        try:
            sb._client._call("files.download", _lib.file_download, sb._cid, _lib.cstr(path),
                             ctypes.byref(opts), cb, None, ctypes.byref(res))
        except Exception:
            if failure:
                raise failure[0]
            raise
        return sink.getvalue() if dst is None else _transfer(res)

    def mkdir(self, path: str, mode: int = 0, parents: bool = False) -> None:
        """Create a directory (mode 0: 0755); parents: its missing parents too, and an
        existing directory is no error."""
        sb = self._sb
        sb._client._call("files.mkdir", _lib.file_mkdir, sb._cid, _lib.cstr(path), int(mode),
                         bool(parents))

    def stat(self, path: str) -> DirEntry:
        """Describe path (a last symlink is not followed); NotFound when it is not there."""
        sb = self._sb
        d = _lib.Dirent()
        sb._client._call("files.stat", _lib.file_stat, sb._cid, _lib.cstr(path), ctypes.byref(d))
        name = ctypes.c_void_p.from_buffer(d, _lib.Dirent.name.offset).value  # libdsec's copy
        try:
            return DirEntry(name=(d.name or b"").decode(), kind=d.kind.decode(), size=d.size,
                            mode=d.mode, mtime=d.mtime)
        finally:
            _lib.free(name)

    def rename(self, src: str, dst: str) -> None:
        """Rename src to dst inside the sandbox; dst, if there, is replaced atomically."""
        sb = self._sb
        sb._client._call("files.rename", _lib.file_rename, sb._cid, _lib.cstr(src),
                         _lib.cstr(dst))

    def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file or an empty directory (recursive: a directory and all it holds)."""
        sb = self._sb
        sb._client._call("files.remove", _lib.file_remove, sb._cid, _lib.cstr(path),
                         bool(recursive))

    def list(self, path: str = "/") -> List[DirEntry]:
        sb = self._sb
        p = ctypes.POINTER(_lib.Dirent)()
        n = ctypes.c_size_t()
        sb._client._call("files.list", _lib.file_list, sb._cid, _lib.cstr(path), ctypes.byref(p),
                         ctypes.byref(n))
        try:
            return [DirEntry(name=p[i].name.decode(), kind=p[i].kind.decode(), size=p[i].size,
                             mode=p[i].mode, mtime=p[i].mtime) for i in range(n.value)]
        finally:
            _lib.dirents_free(p, n)

    def watch(self, path: str, recursive: bool = False) -> "DirWatch":
        """Watch a directory (containers, microVMs, VMs): returns once every
        watch is set; iterate the DirWatch for DirEvents as changes happen.
        The watcher runs in the sandbox until close() (or the sandbox ends);
        events nobody read for long come as one "overflow" event."""
        if _lib.dir_watch is None:
            raise errors.not_supported("files.watch: this libdsec.so (%s) has no dsec_dir_watch; "
                                       "rebuild it" % _lib.path, "files.watch")
        sb = self._sb
        out = _lib.Proc()
        sb._client._call("files.watch", _lib.dir_watch, sb._cid, _lib.cstr(path),
                         bool(recursive), ctypes.byref(out))
        return DirWatch(sb, out.handle)


class DirWatch:
    """A directory watcher (Files.watch): `for ev in w:` yields DirEvents as
    they come; next_events(timeout_s) returns those that came within it."""

    def __init__(self, sb: "Sandbox", handle: int):
        self._p = Process(sb, handle)
        self.handle = int(handle)
        self._off = 0
        self._part = b""
        self.running = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def next_events(self, timeout_s: float = 1.0) -> List[DirEvent]:
        return self._take(self._p.read(self._off, 0, wait_s=timeout_s))

    def _take(self, w: ProcessOutput) -> List[DirEvent]:
        """The events of a read from self._off; moves past them."""
        import json
        evs = []
        if w.stdout_from > self._off:  # dropped before it was read
            evs.append(DirEvent(event="overflow", path="", dir=True))
            data = w.stdout
            nl = data.find(b"\n")
            self._part, data = b"", data[nl + 1:] if nl >= 0 else b""
        else:
            data = self._part + w.stdout
        self._off = w.stdout_from + len(w.stdout)
        lines = data.split(b"\n")
        self._part = lines.pop()
        for line in lines:
            d = json.loads(line)
            if d["event"] != "ready":
                evs.append(DirEvent(event=d["event"], path=d["path"], dir=bool(d["dir"])))
        self.running = w.info.running
        return evs

    def __iter__(self):
        while True:
            evs = self.next_events(1.0)
            yield from evs
            if not self.running and not evs:
                return

    def close(self) -> None:
        try:
            self._p.kill()
        except (errors.StateError, errors.NotFound):
            pass


def _proc_info(p) -> ProcessInfo:
    return ProcessInfo(handle=p.handle, pid=p.pid, running=bool(p.running),
                       cmdline=p.cmdline.decode(errors="replace"), exit_code=p.exit_code,
                       signal=p.signal, timed_out=bool(p.timed_out),
                       stdin_open=bool(p.stdin_open), started_ns=p.started_ns,
                       ended_ns=p.ended_ns, stdout_total=p.out_total, stderr_total=p.err_total,
                       pty=bool(p.pty), session=bool(p.session), busy=bool(p.busy))


class Process:
    """A background process of a sandbox, named by its handle. It runs on
    whether or not anything holds this object: Sandbox.processes.get(handle)
    finds it again from any client."""

    def __init__(self, sb: "Sandbox", handle: int):
        self._sb = sb
        self.handle = int(handle)
        self._out = 0  # where follow() and wait() have read up to
        self._err = 0

    def __repr__(self):
        return "Process(%r, handle=%d)" % (self._sb.id, self.handle)

    def read(self, stdout_from: int = 0, stderr_from: int = 0, max_bytes: int = 0,
             wait_s: float = 0) -> ProcessOutput:
        """Its output from these stream offsets: what the sandbox still keeps
        from there (stdout_from/stderr_from of the answer are higher when older
        bytes were dropped), at most max_bytes of each stream (0: up to 3 MiB).
        wait_s (at most 60): when there is nothing new yet and it runs, the
        answer comes as soon as output does, it exits, or wait_s passed."""
        sb = self._sb
        o = _lib.ProcOut()
        if wait_s and _lib.proc_read_wait is not None:
            if not 0 <= wait_s <= 60:
                raise _invalid("processes.read", "wait_s must be 0..60, got %r" % (wait_s,))
            sb._client._call("processes.read", _lib.proc_read_wait, sb._cid, self.handle,
                             int(stdout_from), int(stderr_from), int(max_bytes),
                             int(wait_s * 1000), ctypes.byref(o))
        else:
            sb._client._call("processes.read", _lib.proc_read, sb._cid, self.handle,
                             int(stdout_from), int(stderr_from), int(max_bytes),
                             ctypes.byref(o))
        try:
            return ProcessOutput(info=_proc_info(o.info),
                                 stdout=ctypes.string_at(o.out, o.out_len) if o.out_len else b"",
                                 stderr=ctypes.string_at(o.err, o.err_len) if o.err_len else b"",
                                 stdout_from=o.out_from, stderr_from=o.err_from)
        finally:
            _lib.proc_out_free(ctypes.byref(o))

    def info(self) -> ProcessInfo:
        return self.read(max_bytes=1).info

    def follow(self, poll_s: float = 0.05):
        """Yield (stdout, stderr) byte pairs as the process writes them, from
        what the sandbox still keeps, until it has exited and all is read."""
        import time
        while True:
            t0 = time.monotonic()
            w = self.read(self._out, self._err, wait_s=1.0)
            self._out = w.stdout_from + len(w.stdout)
            self._err = w.stderr_from + len(w.stderr)
            if w.stdout or w.stderr:
                yield w.stdout, w.stderr
                continue
            if not w.info.running:
                return
            if time.monotonic() - t0 < 0.5:  # a sandbox that answers at once: poll
                time.sleep(poll_s)

    def wait(self, timeout: Optional[float] = None, poll_s: float = 0.05) -> ProcessInfo:
        """Wait until it exits (Timeout after timeout seconds); its final info."""
        import time
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.info()
            if not info.running:
                return info
            if end is not None and time.monotonic() >= end:
                raise self._still_running(timeout)
            time.sleep(poll_s)

    def _still_running(self, timeout: float) -> errors.DSecError:
        """wait's Timeout error."""
        return errors.error_from_code(
            4, "processes.wait: process %d in %s still running after %.1f s"
            % (self.handle, self._sb.id, timeout), op="processes.wait")

    def write(self, data: Data, close: bool = False) -> None:
        """Write to its stdin (started with keep_stdin=True); returns once the
        process has taken every byte. close: then close its stdin."""
        sb = self._sb
        buf = _bytes(data)
        for i in range(0, max(len(buf), 1), 8 << 20):
            part = buf[i:i + (8 << 20)]
            last = i + (8 << 20) >= len(buf)
            sb._client._call("processes.write", _lib.proc_write, sb._cid, self.handle, part,
                             len(part), bool(close and last))

    def close_stdin(self) -> None:
        self.write(b"", close=True)

    def signal(self, sig: int) -> None:
        """Send sig; SIGKILL (9) ends its whole process tree. StateError once it
        has exited."""
        sb = self._sb
        sb._client._call("processes.signal", _lib.proc_signal, sb._cid, self.handle, int(sig))

    def kill(self) -> None:
        self.signal(9)


class Processes:
    """sandbox.processes: commands that run in the background (servers,
    watchers, long builds), outliving the call and the client."""

    def __init__(self, sb: "Sandbox"):
        self._sb = sb

    def _check(self):
        if _lib.proc_start is None:
            raise errors.not_supported("processes: this libdsec.so (%s) has no dsec_proc_start; "
                                       "rebuild it" % _lib.path, "processes")

    def start(self, argv: Optional[Sequence[str]] = None, env: Optional[dict] = None,
              cwd: Optional[str] = None, user: Optional[str] = None, timeout_s: float = 0,
              ring_bytes: int = 0, keep_stdin: bool = False,
              stdin: Optional[Data] = None) -> Process:
        """Start argv (None or []: the environment's default command) in the background;
        its Process. timeout_s (0: never) ends
        its whole process tree; ring_bytes (0: 256 KiB, at most 16 MiB) of each
        stream are kept for read/follow; keep_stdin leaves stdin open for
        Process.write."""
        self._check()
        if isinstance(argv, str):
            raise errors.InvalidArgument("processes.start: argv must be a list (e.g. "
                                         "[\"sh\", \"-c\", line]), got a str",
                                         code="invalid", code_num=1, op="processes.start")
        sb = self._sb
        av = _lib.strv(list(argv or []))
        ev = _lib.strv(["%s=%s" % kv for kv in (env or {}).items()])
        data = _bytes(stdin) if stdin is not None else b""
        opts = _lib.ProcOpts(argv=av, env=ev, cwd=_lib.cstr(cwd), user=_lib.cstr(user or sb.user),
                             timeout_ms=int(timeout_s * 1000), ring_max=int(ring_bytes),
                             keep_stdin=bool(keep_stdin),
                             stdin_data=ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p)
                             if data else None, stdin_len=len(data))
        out = _lib.Proc()
        sb._client._call("processes.start", _lib.proc_start, sb._cid, ctypes.byref(opts),
                         ctypes.byref(out))
        return Process(sb, out.handle)

    def list(self) -> List[ProcessInfo]:
        """Every process the sandbox keeps: running, and ended ones (the oldest
        ended ones are dropped beyond 1,024)."""
        self._check()
        sb = self._sb
        p = ctypes.POINTER(_lib.Proc)()
        n = ctypes.c_size_t()
        sb._client._call("processes.list", _lib.proc_list, sb._cid, ctypes.byref(p),
                         ctypes.byref(n))
        try:
            return [_proc_info(p[i]) for i in range(n.value)]
        finally:
            _lib.free(p)

    def get(self, handle: int) -> Process:
        """The process with this handle (no call is made: a wrong handle raises
        NotFound on first use)."""
        self._check()
        return Process(self._sb, handle)


class Pty(Process):
    """A process on a terminal (Sandbox.pty): what it prints, echo included,
    comes from read()/iteration; write() types; resize() changes the window.
    Ctrl-C is interrupt() (the byte 0x03: its terminal signals the
    foreground job, as on any terminal)."""

    def __repr__(self):
        return "Pty(%r, handle=%d)" % (self._sb.id, self.handle)

    def recv(self, timeout_s: float = 1.0) -> bytes:
        """The output that came since the last recv, waiting up to timeout_s
        (at most 60) for some; b"" when none came, or when it has exited and
        everything was read (see running())."""
        w = self.read(self._out, 0, wait_s=timeout_s)
        if w.stdout_from > self._out:
            self.dropped = getattr(self, "dropped", 0) + w.stdout_from - self._out
        self._out = w.stdout_from + len(w.stdout)
        self._last = w.info
        return w.stdout

    def running(self) -> bool:
        info = getattr(self, "_last", None) or self.info()
        return info.running or self._out < info.stdout_total

    def __iter__(self):
        """Yield output as it comes until the process exits and all is read."""
        while True:
            data = self.recv(1.0)
            if data:
                yield data
            elif not self.running():
                return

    def interrupt(self) -> None:
        self.write(b"\x03")

    def resize(self, rows: int, cols: int) -> None:
        if not (1 <= int(rows) <= 65535 and 1 <= int(cols) <= 65535):
            raise _invalid("pty.resize", "rows and cols must be 1..65535, got %r x %r"
                           % (rows, cols))
        sb = self._sb
        sb._client._call("pty.resize", _lib.proc_resize, sb._cid, self.handle, int(rows),
                         int(cols))


class Shell:
    """A persistent shell session (Sandbox.shell): run() executes one command
    line at a time in the same shell, so cd, export, functions and variables
    carry over. Each command has its own exit code, stdout, stderr and
    timeout; interrupt() (from another thread) ends the running command only.
    The session lives in the sandbox until close(), `exit`, or the sandbox's
    end; Shell(sandbox, handle) attaches to an existing one."""

    def __init__(self, sb: "Sandbox", handle: int):
        self._sb = sb
        self.handle = int(handle)

    def __repr__(self):
        return "Shell(%r, handle=%d)" % (self._sb.id, self.handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run(self, command: str, timeout_s: float = 0, check: bool = False,
            output_max: int = 0) -> ExecResult:
        """Run a command line in the session; its result. timeout_s (0: none)
        kills that command only (timed_out set); the session goes on.
        check: raise CommandFailed unless it exited 0."""
        if not isinstance(command, str) or not command:
            raise _invalid("shell.run", "command must be a non-empty str, got %r" % (command,))
        sb = self._sb
        return sb._exec_opts([command], timeout_ms=int(timeout_s * 1000), check=check,
                             output_max=output_max, session=self.handle)

    def interrupt(self) -> None:
        """End the running command as Ctrl-C would (its result says
        interrupted, exit code 130); the session keeps its state."""
        sb = self._sb
        sb._client._call("shell.interrupt", _lib.session_interrupt, sb._cid, self.handle)

    def info(self) -> ProcessInfo:
        return Process(self._sb, self.handle).info()

    def close(self) -> None:
        """End the session (its shell and whatever it still runs)."""
        try:
            Process(self._sb, self.handle).kill()
        except (errors.StateError, errors.NotFound):
            pass


class Sandbox:
    """A running sandbox, driven with blocking calls.

    user and rollout_id are defaults for exec (and for file writes with a step)."""

    def __init__(self, client: DSecClient, info: SandboxInfo, user: Optional[str] = None,
                 rollout_id: Optional[str] = None):
        self._client = client
        self.info = info
        self.id = info.id
        self.user = user
        self.rollout_id = rollout_id

    # made on first use: a trainer that creates many sandboxes pays for them
    # only on the ones it drives
    @functools.cached_property
    def files(self) -> Files:
        return Files(self)

    @functools.cached_property
    def processes(self) -> Processes:
        return Processes(self)

    @staticmethod
    def list(client: DSecClient, label=None, state=None, type=None, limit=None, page_size=1000,
             **kw):
        """The client's tenant's sandboxes matching label (a dict), state and type, as
        fleet.ListedSandbox, page by page; at most limit of them (None: all)."""
        import itertools
        it = iter(client.list(label=label, state=state, type=type, page_size=page_size, **kw))
        return it if limit is None else itertools.islice(it, int(limit))

    @functools.cached_property
    def _cid(self) -> bytes:
        return self.id.encode()

    def __repr__(self):
        return "Sandbox(%r, type=%r)" % (self.id, self.info.type)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.stop()
        except errors.NotFound:
            pass

    @property
    def type(self) -> str:
        return self.info.type

    def pty(self, argv: Sequence[str] = ("/bin/sh",), rows: int = 24, cols: int = 80,
            env: Optional[dict] = None, cwd: Optional[str] = None,
            user: Optional[str] = None, timeout_s: float = 0) -> Pty:
        """Start argv on a terminal of rows x cols, as `docker exec -it`
        does: a Pty to type into and read from. It runs on after the call
        (Sandbox.processes lists it) until it exits or is killed."""
        if _lib.proc_resize is None:
            raise errors.not_supported("pty: this libdsec.so (%s) has no terminals; rebuild it"
                                       % _lib.path, "pty")
        if isinstance(argv, str):
            raise _invalid("pty", "argv must be a list (e.g. [\"/bin/bash\"]), got a str")
        if not (1 <= int(rows) <= 65535 and 1 <= int(cols) <= 65535):
            raise _invalid("pty", "rows and cols must be 1..65535, got %r x %r" % (rows, cols))
        av = _lib.strv(list(argv))
        ev = _lib.strv(["%s=%s" % kv for kv in (env or {}).items()])
        opts = _lib.ProcOpts(argv=av, env=ev, cwd=_lib.cstr(cwd), user=_lib.cstr(user or self.user),
                             timeout_ms=int(timeout_s * 1000), keep_stdin=True, pty=True,
                             rows=int(rows), cols=int(cols))
        out = _lib.Proc()
        self._client._call("pty", _lib.proc_start, self._cid, ctypes.byref(opts),
                           ctypes.byref(out))
        return Pty(self, out.handle)

    def shell(self, shell: Optional[str] = None) -> Shell:
        """Start a persistent shell session (bash, or sh where the image has
        no bash; or shell, an absolute path): a Shell whose run() keeps the
        directory, environment and variables from one command to the next."""
        if _lib.session_start is None:
            raise errors.not_supported("shell: this libdsec.so (%s) has no shell sessions; "
                                       "rebuild it" % _lib.path, "shell")
        out = _lib.Proc()
        self._client._call("shell", _lib.session_start, self._cid, _lib.cstr(shell),
                           ctypes.byref(out))
        return Shell(self, out.handle)

    def exec(self, argv: Optional[Sequence[str]] = None, env: Optional[dict] = None,
             cwd: Optional[str] = None,
             stdin: Optional[Data] = None, timeout_ms: int = 0, user: Optional[str] = None,
             step: Optional[int] = None, rollout_id: Optional[str] = None,
             check: bool = False, output_max: int = 0,
             req_id: Optional[str] = None) -> ExecResult:
        """Run argv (None or []: the environment's default command, an imported image's
        Entrypoint and Cmd; InvalidArgument when it has none). With step (and the sandbox's
        or the given rollout_id) the
        step is recorded in the trajectory log; re-issuing a logged step returns
        the logged result without running it (fast-forward), and a different
        request at a logged step raises Diverged. check: raise CommandFailed on a
        non-zero exit. output_max: keep at most this many bytes of stdout and of
        stderr (the rest is dropped and the result says so); 0: 1 MiB. req_id
        names the command: the node keeps a finished command's answer for 10
        minutes (its results_ttl_s), across restarts of its node manager, and an
        exec with the same req_id gets that answer without running it again (a
        TimedOut error names the req_id it used); a command that was running
        when its node manager went away is not run again either: StateError
        says its outcome was lost. The call
        waits as long as timeout_ms plus 30 s, at least the client's timeout."""
        if isinstance(argv, str):
            raise errors.InvalidArgument("exec: argv must be a list (use run_shell for a "
                                         "command line)", code="invalid", code_num=1, op="exec")
        return self._exec_opts(argv, env=env, cwd=cwd, stdin=stdin, timeout_ms=timeout_ms,
                               user=user, step=step, rollout_id=rollout_id, check=check,
                               output_max=output_max, req_id=req_id)

    def _exec_opts(self, argv, env=None, cwd=None, stdin=None, timeout_ms=0, user=None,
                   step=None, rollout_id=None, check=False, output_max=0, req_id=None,
                   session=0, op="exec") -> ExecResult:
        av = _lib.strv(list(argv or []))
        ev = _lib.strv(["%s=%s" % kv for kv in (env or {}).items()])
        sd = _bytes(stdin) if stdin is not None else None
        rid = (rollout_id or self.rollout_id) if step is not None else None
        opts = _lib.ExecOpts(argv=av, env=ev, cwd=_lib.cstr(cwd),
                             stdin_data=ctypes.cast(ctypes.c_char_p(sd), ctypes.c_void_p)
                             if sd else None,
                             stdin_len=len(sd) if sd else 0, timeout_ms=int(timeout_ms),
                             user=_lib.cstr(None if session else (user or self.user)),
                             rollout_id=_lib.cstr(rid),
                             step=int(step or 0), output_max=int(output_max),
                             req_id=_lib.cstr(req_id), session=int(session))
        rep = _lib.ExecReply()
        op = "shell.run" if session else "exec"
        self._client._call(op, _lib.exec_, self._cid, ctypes.byref(opts), ctypes.byref(rep))
        try:
            res = ExecResult(exit_code=rep.exit_code,
                             stdout=ctypes.string_at(rep.out, rep.out_len) if rep.out_len else b"",
                             stderr=ctypes.string_at(rep.err_out, rep.err_len)
                             if rep.err_len else b"",
                             signal=rep.signal, timed_out=bool(rep.timed_out),
                             stdout_truncated=bool(rep.out_truncated),
                             stderr_truncated=bool(rep.err_truncated),
                             duration_us=rep.duration_us, cpu_us=rep.cpu_us,
                             peak_rss_kb=rep.peak_rss_kb, interrupted=bool(rep.interrupted),
                             session_ended=bool(rep.session_ended))
        finally:
            _lib.exec_reply_release(ctypes.byref(rep))
        if check and not res.ok:
            raise CommandFailed(argv, res)
        return res

    def run_shell(self, command: str, **kw) -> ExecResult:
        """Run a command line with /bin/sh -c (same keywords as exec)."""
        return self.exec(["/bin/sh", "-c", command], **kw)

    def fork(self, n: int = 1) -> List["Sandbox"]:
        """n copies of this sandbox (files and state), each a new Sandbox.
        Each child starts from the parent's state at the branch point; later
        writes of the parent or of another child are not seen (for
        containers: a snapshot of the writable layer, O(1))."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
            raise _invalid("fork", "n must be an integer 1..1024, got %r" % (n,))
        ids = ctypes.POINTER(ctypes.c_char_p)()
        nids = ctypes.c_size_t()
        self._client._call("fork", _lib.fork, self._cid, int(n), ctypes.byref(ids),
                           ctypes.byref(nids))
        try:
            kids = [ids[i].decode() for i in range(nids.value)]
        finally:
            _lib.strv_free(ids, nids)
        return [Sandbox(self._client, SandboxInfo(id=k, node=self.info.node, type=self.info.type,
                                                  state="running", cell=self.info.cell),
                        user=self.user, rollout_id=self.rollout_id) for k in kids]

    def pause(self) -> None:
        self._client._call("pause", _lib.pause, self._cid)

    def resume(self) -> None:
        self._client._call("resume", _lib.resume, self._cid)

    def status(self) -> SandboxInfo:
        out = _lib.SandboxInfo()
        self._client._call("status", _lib.status, self._cid, ctypes.byref(out))
        self.info = _info(out)
        return self.info

    def wait_state(self, state: str, timeout_ms: int = 10000) -> None:
        self._client._call("wait_state", _lib.wait_state, self._cid, _lib.cstr(state),
                           int(timeout_ms))

    def snapshot(self, name: str) -> str:
        """Publish this sandbox's state as environment name ("name:version",
        e.g. "team/solved:1") in the cell's layer registry and return name:
        run_container(environment=name) then starts from this state on any
        node of the cell. The sandbox keeps running. Containers only: other
        types raise NotSupported (code "unsupported", not retry-safe). A name
        that is not name:version raises InvalidArgument."""
        if not isinstance(name, str) or not name:
            raise errors.error_from_code(
                1, "snapshot: name must be an environment name:version (e.g. \"team/solved:1\"), "
                "got %r" % (name,), op="snapshot")
        if _lib.snapshot is None:
            raise errors.not_supported("snapshot: this libdsec.so (%s) has no dsec_snapshot; "
                                       "rebuild it" % _lib.path, "snapshot")
        self._client._call("snapshot", _lib.snapshot, self._cid, name.encode())
        return name

    def set_network(self, network) -> None:
        """Replace the sandbox's network policy while it runs, e.g.
        {"pypi": True, "github.com:443/tcp": True}: rules mapped to True are
        allowed, everything else is denied ({} reaches nothing). New
        connections follow it at once; connections it no longer allows are
        cut (docs/network.md). A bad rule raises InvalidArgument naming it;
        a node without network containment raises NotSupported."""
        entries = _net_entries(network, "set_network")
        if _lib.set_network is None:
            raise errors.not_supported("set_network: this libdsec.so (%s) has no "
                                       "dsec_set_network; rebuild it" % _lib.path, "set_network")
        arr = (ctypes.c_char_p * (len(entries) + 1))(*[e.encode() for e in entries], None)
        self._client._call("set_network", _lib.set_network, self._cid, arr, len(entries))

    def set_timeout(self, seconds: int) -> float:
        """Make the sandbox end `seconds` from now, sooner or later than it would
        have (its max_lifetime_s counts from its creation). Its whole lifetime
        must stay within the cell's max_ttl_s: beyond it, or for seconds < 1,
        InvalidArgument says how much more it may have. Returns its new end, in
        seconds since the epoch. It holds across a restart of the node
        manager."""
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
            raise errors.error_from_code(
                1, "set_timeout: seconds must be an int of at least 1, got %r (stop() ends a "
                "sandbox now)" % (seconds,), op="set_timeout")
        if _lib.set_ttl is None:
            raise errors.not_supported("set_timeout: this libdsec.so (%s) has no dsec_set_ttl; "
                                       "rebuild it" % _lib.path, "set_timeout")
        end = ctypes.c_uint64(0)
        self._client._call("set_timeout", _lib.set_ttl, self._cid, int(seconds),
                           ctypes.byref(end))
        return end.value / 1e9

    def stop(self) -> None:
        """Destroy the sandbox."""
        self._client._call("stop", _lib.destroy, self._cid)


class CommandFailed(errors.DSecError):
    """exec(check=True) of a command that did not exit 0."""

    def __init__(self, argv, result: ExecResult):
        super().__init__("command %r exited %d%s: %s" % (
            list(argv), result.exit_code, " (timed out)" if result.timed_out else "",
            result.stderr.decode(errors="replace").strip()[:200]),
            code="command_failed", retry_safe=False, op="exec")
        self.result = result


# ---- asyncio ----------------------------------------------------------------------------------

async def _awaited(aw):
    return await aw


def _await_from_thread(loop, aw, stop: threading.Event):
    """On a worker thread: run the awaitable aw on loop and return its result.
    Waits in steps of 0.25 s; once stop is set (the awaiting task was
    cancelled), cancels it and raises CancelledError, so the thread does not
    wait for a loop that no longer serves it."""
    import concurrent.futures
    coro = _awaited(aw)
    if stop.is_set():
        coro.close()
        if asyncio.iscoroutine(aw):
            aw.close()
        raise asyncio.CancelledError()
    try:
        cf = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed
        coro.close()
        if asyncio.iscoroutine(aw):
            aw.close()
        raise asyncio.CancelledError()
    while not concurrent.futures.wait([cf], timeout=0.25).done:
        if stop.is_set():
            cf.cancel()
            raise asyncio.CancelledError()
    return cf.result()


class _Stoppable:
    """A transfer's sync source or destination on a worker thread: its next
    read or write fails once stop is set (the awaiting task was cancelled)."""

    def __init__(self, f, stop: threading.Event):
        self.f = f
        self.stop = stop

    def read(self, n: int):
        if self.stop.is_set():
            raise asyncio.CancelledError()
        return self.f.read(n)

    def write(self, b: bytes):
        if self.stop.is_set():
            raise asyncio.CancelledError()
        return self.f.write(b)


_END = object()


async def _next_chunk(it):
    try:
        return await it.__anext__()
    except StopAsyncIteration:
        return _END


class _AsyncSource:
    """A blocking read(n) over an async source (an object with a coroutine
    read(n), e.g. an asyncio.StreamReader, or an async iterable of bytes),
    for Files.upload running on a worker thread."""

    def __init__(self, src, loop, stop: threading.Event):
        self.loop = loop
        self.stop = stop
        self.reader = src.read if _is_async(getattr(src, "read", None)) else None
        self.it = src.__aiter__() if self.reader is None else None
        self.buf = bytearray()
        self.done = False

    def read(self, n: int) -> bytes:
        if self.reader is not None:
            return _bytes(_await_from_thread(self.loop, self.reader(n), self.stop))
        buf = self.buf
        while len(buf) < n and not self.done:
            chunk = _await_from_thread(self.loop, _next_chunk(self.it), self.stop)
            if chunk is _END:
                self.done = True
            else:
                buf += _bytes(chunk)
        out = bytes(buf[:n])
        del buf[:n]
        return out


class _AsyncSink:
    """A blocking write(b) over an async destination (an object with a
    coroutine write(b), or an asyncio.StreamWriter: write then drain), for
    Files.download running on a worker thread: each page waits until the
    destination took it."""

    def __init__(self, dst, loop, stop: threading.Event):
        self.dst = dst
        self.loop = loop
        self.stop = stop

    async def _stream_write(self, b):
        self.dst.write(b)
        await self.dst.drain()

    def write(self, b: bytes) -> None:
        if isinstance(self.dst, asyncio.StreamWriter):
            aw = self._stream_write(b)
        else:
            aw = self.dst.write(b)
        _await_from_thread(self.loop, aw, self.stop)


def _is_async(fn) -> bool:
    return fn is not None and asyncio.iscoroutinefunction(fn)


class AsyncFiles:
    """sandbox.files as coroutines: each call is the blocking Files call run
    on the client's thread pool. upload and download stream (never the whole
    file in memory) from and to sync file objects as Files does, and also
    from async sources and to async destinations; iter_download yields the
    pages as they come."""

    def __init__(self, asb: "AsyncSandbox"):
        self._asb = asb

    async def write(self, path: str, data: Data, **kw) -> None:
        """Files.write (same keywords): data of any size, held whole."""
        return await self._asb._run(self._asb.sync.files.write, path, data, **kw)

    async def read(self, path: str) -> bytes:
        """Files.read: the whole file (iter_download streams it instead)."""
        return await self._asb._run(self._asb.sync.files.read, path)

    async def list(self, path: str = "/") -> List[DirEntry]:
        return await self._asb._run(self._asb.sync.files.list, path)

    async def _run_transfer(self, fn, *args, **kw):
        """fn(stop, *args, **kw) on the pool; stop (a threading.Event) is set
        when the awaiting task is cancelled, so a transfer waiting on this loop gives up (its
        next read or page fails it) instead of holding its thread."""
        stop = threading.Event()
        try:
            return await self._asb._run(fn, stop, *args, **kw)
        finally:
            stop.set()

    async def upload(self, path: str, src, **kw) -> Transfer:
        """Files.upload (same keywords: mode, upload_id, resume, chunk_size,
        window): stream src to path. src is bytes/str, a file-like object
        with read(n) (called on a worker thread), an object with a coroutine
        read(n) (an asyncio.StreamReader) or an async iterable of bytes (read
        on this loop, only as fast as the chunks go). Cancelling the call
        fails the upload at its next read (within about 0.25 s when it waits
        for an async source); resume it as Files.upload says."""
        loop = asyncio.get_running_loop()
        if _is_async(getattr(src, "read", None)) or hasattr(src, "__aiter__"):
            def source(stop):
                return _AsyncSource(src, loop, stop)
        else:
            if isinstance(src, (bytes, bytearray, memoryview, str)):
                import io
                src = io.BytesIO(_bytes(src))

            def source(stop):
                return _Stoppable(src, stop)

        def run(stop):
            return self._asb.sync.files.upload(path, source(stop), **kw)

        return await self._run_transfer(run)

    async def download(self, path: str, dst=None, **kw):
        """Files.download (same keywords: page_size, window): stream path into
        dst and return a Transfer; with dst None, the bytes. dst is a
        file-like object with write(b) (called on a worker thread), an object
        with a coroutine write(b), or an asyncio.StreamWriter (write, then
        drain): each page waits until dst took it, so at most a window of
        pages is held. The sha256 is checked at the end (BackendError when it
        differs: read it again). Cancelling the call stops the download at its
        next page."""
        loop = asyncio.get_running_loop()
        if dst is None:
            import io
            buf = io.BytesIO()

            def run(stop):
                self._asb.sync.files.download(path, _Stoppable(buf, stop), **kw)
                return buf.getvalue()
        elif _is_async(getattr(dst, "write", None)) or isinstance(dst, asyncio.StreamWriter):
            def run(stop):
                return self._asb.sync.files.download(path, _AsyncSink(dst, loop, stop), **kw)
        else:
            def run(stop):
                return self._asb.sync.files.download(path, _Stoppable(dst, stop), **kw)

        return await self._run_transfer(run)

    async def iter_download(self, path: str, page_size: int = 0,
                            window: int = 0) -> AsyncIterator[bytes]:
        """Yield path's content page by page (at most page_size bytes each; 0:
        4 MiB) as it arrives, with download's checks: a file that changes
        while it is read raises StateError, a sha256 that differs at the end
        BackendError, both after the pages before it were yielded. The
        download waits while the consumer does not take the pages (a consumer
        that stalls past the client's timeout fails it). Closing the iterator
        early stops it at its next page (`break` closes it when it is
        collected; contextlib.aclosing closes it at once).

            async for page in asb.files.iter_download("/work/big.bin"):
                h.update(page)
        """
        q: asyncio.Queue = asyncio.Queue(maxsize=1)

        class Sink:
            async def write(self, b):
                await q.put(b)

        task = asyncio.ensure_future(self.download(path, Sink(), page_size=page_size,
                                                   window=window))
        try:
            while True:
                get = asyncio.ensure_future(q.get())
                await asyncio.wait((get, task), return_when=asyncio.FIRST_COMPLETED)
                if get.done():
                    yield get.result()
                    continue
                get.cancel()
                while not q.empty():
                    yield q.get_nowait()
                task.result()  # the download's failure, if it failed
                return
        finally:
            if not task.done():
                task.cancel()  # its thread stops at its next page
            elif not task.cancelled():
                task.exception()  # left early: its outcome is nobody's

    async def watch(self, path: str, recursive: bool = False) -> "AsyncDirWatch":
        """Files.watch: returns once every watch is set; `async for ev in w`."""
        return AsyncDirWatch(self._asb, await self._asb._run(self._asb.sync.files.watch, path,
                                                             recursive))

    async def upload_held(self, path: str, upload_id: str) -> int:
        return await self._asb._run(self._asb.sync.files.upload_held, path, upload_id)

    async def mkdir(self, path: str, **kw) -> None:
        return await self._asb._run(self._asb.sync.files.mkdir, path, **kw)

    async def stat(self, path: str) -> DirEntry:
        return await self._asb._run(self._asb.sync.files.stat, path)

    async def rename(self, src: str, dst: str) -> None:
        return await self._asb._run(self._asb.sync.files.rename, src, dst)

    async def remove(self, path: str, **kw) -> None:
        return await self._asb._run(self._asb.sync.files.remove, path, **kw)


class AsyncDirWatch:
    """A DirWatch as coroutines (AsyncFiles.watch): `async for ev in w` yields
    DirEvents as they come. Each wait is a read of at most 1 s on the
    client's thread pool, and the events are taken from it on the loop: a
    task cancelled while it waits loses no event, and the watcher runs on
    (close() ends it)."""

    def __init__(self, asb: "AsyncSandbox", sync: DirWatch):
        self._asb = asb
        self.sync = sync
        self.handle = sync.handle

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def next_events(self, timeout_s: float = 1.0) -> List[DirEvent]:
        """The events that came within timeout_s (at most 60)."""
        w = self.sync
        return w._take(await self._asb._run(w._p.read, w._off, 0, 0, timeout_s))

    async def __aiter__(self) -> AsyncIterator[DirEvent]:
        while True:
            evs = await self.next_events(1.0)
            for ev in evs:
                yield ev
            if not self.sync.running and not evs:
                return

    async def close(self) -> None:
        return await self._asb._run(self.sync.close)


class AsyncProcess:
    """A background Process as coroutines (AsyncProcesses.start/get). Every
    blocking call runs on the client's thread pool, and none holds a thread
    long: follow() and iteration wait for output with reads of at most 1 s,
    and wait() polls. Cancelling a task that awaits one of them leaves the
    process running (only kill()/signal() end it) and its thread comes back
    within that bound; output a cancelled read fetched is read again by the
    next follow().

        p = await asb.processes.start(["sh", "-c", "make 2>&1"])
        async for out, err in p:
            log(out, err)
        info = await p.wait()
    """

    def __init__(self, asb: "AsyncSandbox", sync: Process):
        self._asb = asb
        self.sync = sync
        self.handle = sync.handle

    def __repr__(self):
        return "AsyncProcess(%r, handle=%d)" % (self._asb.id, self.handle)

    async def read(self, stdout_from: int = 0, stderr_from: int = 0, max_bytes: int = 0,
                   wait_s: float = 0) -> ProcessOutput:
        """Process.read: its kept output from these offsets; wait_s (at most
        60) waits for some when there is nothing new yet and it runs."""
        return await self._asb._run(self.sync.read, stdout_from, stderr_from, max_bytes, wait_s)

    async def info(self) -> ProcessInfo:
        return await self._asb._run(self.sync.info)

    async def write(self, data: Data, close: bool = False) -> None:
        """Write to its stdin (started with keep_stdin=True); returns once the
        process has taken every byte. close: then close its stdin."""
        return await self._asb._run(self.sync.write, data, close)

    async def close_stdin(self) -> None:
        return await self._asb._run(self.sync.close_stdin)

    async def signal(self, sig: int) -> None:
        """Send sig; SIGKILL (9) ends its whole process tree. StateError once it
        has exited."""
        return await self._asb._run(self.sync.signal, sig)

    async def kill(self) -> None:
        return await self._asb._run(self.sync.kill)

    async def wait(self, timeout: Optional[float] = None, poll_s: float = 0.05) -> ProcessInfo:
        """Wait until it exits (Timeout after timeout seconds); its final info.
        Polls with info() every poll_s: no thread waits longer than one call."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while True:
            info = await self.info()
            if not info.running:
                return info
            if end is not None and loop.time() >= end:
                raise self.sync._still_running(timeout)
            await asyncio.sleep(poll_s)

    async def follow(self, poll_s: float = 0.05) -> AsyncIterator[Tuple[bytes, bytes]]:
        """Yield (stdout, stderr) byte pairs as the process writes them, from
        what the sandbox still keeps, until it has exited and all is read
        (Process.follow's way, and from the same offsets: a second follow goes
        on where the first stopped). Each wait is a read of at most 1 s on
        the thread pool; a sandbox that answers at once is polled every
        poll_s."""
        p = self.sync
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            w = await self._asb._run(p.read, p._out, p._err, 0, 1.0)
            p._out = w.stdout_from + len(w.stdout)
            p._err = w.stderr_from + len(w.stderr)
            if w.stdout or w.stderr:
                yield w.stdout, w.stderr
                continue
            if not w.info.running:
                return
            if loop.time() - t0 < 0.5:
                await asyncio.sleep(poll_s)

    def __aiter__(self) -> AsyncIterator[Tuple[bytes, bytes]]:
        """`async for out, err in p:` is follow()."""
        return self.follow()


class AsyncProcesses:
    """sandbox.processes as coroutines: start, list and get give AsyncProcess
    handles (their .sync is the blocking Process)."""

    def __init__(self, asb: "AsyncSandbox"):
        self._asb = asb

    async def start(self, argv=None, **kw) -> AsyncProcess:
        """Processes.start (same keywords): start argv in the background."""
        return AsyncProcess(self._asb, await self._asb._run(self._asb.sync.processes.start,
                                                            argv, **kw))

    async def list(self) -> List[ProcessInfo]:
        return await self._asb._run(self._asb.sync.processes.list)

    def get(self, handle: int) -> AsyncProcess:
        """The process with this handle, e.g. one another client started (no
        call is made: a wrong handle raises NotFound on first use). Its
        follow() starts from what the sandbox still keeps."""
        return AsyncProcess(self._asb, self._asb.sync.processes.get(handle))


class AsyncPty(AsyncProcess):
    """A Pty as coroutines: `async for data in pty` yields its output as it
    comes (each wait runs on the client's thread pool); the AsyncProcess calls
    (write, info, signal, kill, wait) apply too."""

    sync: Pty

    def __repr__(self):
        return "AsyncPty(%r, handle=%d)" % (self._asb.id, self.handle)

    async def recv(self, timeout_s: float = 1.0) -> bytes:
        return await self._asb._run(self.sync.recv, timeout_s)

    async def resize(self, rows: int, cols: int):
        return await self._asb._run(self.sync.resize, rows, cols)

    async def interrupt(self):
        return await self._asb._run(self.sync.interrupt)

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        while True:
            data = await self.recv(1.0)
            if data:
                return data
            if not await self._asb._run(self.sync.running):
                raise StopAsyncIteration


class AsyncShell:
    """A Shell as coroutines: await run(command); interrupt() from another
    task ends the running command only."""

    def __init__(self, asb: "AsyncSandbox", sync: Shell):
        self._asb = asb
        self.sync = sync
        self.handle = sync.handle

    async def run(self, command: str, **kw) -> ExecResult:
        return await self._asb._run(self.sync.run, command, **kw)

    async def interrupt(self):
        return await self._asb._run(self.sync.interrupt)

    async def info(self) -> ProcessInfo:
        return await self._asb._run(self.sync.info)

    async def close(self):
        return await self._asb._run(self.sync.close)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class AsyncSandbox:
    """The asyncio face of a Sandbox: the same methods, as coroutines."""

    def __init__(self, aclient: "AsyncDSecClient", sync: Sandbox):
        self._aclient = aclient
        self.sync = sync
        self.id = sync.id
        self.info = sync.info

    @functools.cached_property
    def processes(self) -> AsyncProcesses:
        return AsyncProcesses(self)

    @functools.cached_property
    def files(self) -> AsyncFiles:
        return AsyncFiles(self)

    async def pty(self, argv=("/bin/sh",), **kw) -> AsyncPty:
        return AsyncPty(self, await self._run(self.sync.pty, argv, **kw))

    async def shell(self, shell: Optional[str] = None) -> AsyncShell:
        return AsyncShell(self, await self._run(self.sync.shell, shell))

    def __repr__(self):
        return "AsyncSandbox(%r, type=%r)" % (self.id, self.info.type)

    @property
    def rollout_id(self):
        return self.sync.rollout_id

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        try:
            await self.stop()
        except errors.NotFound:
            pass

    async def _run(self, fn, *args, **kw):
        loop = asyncio.get_running_loop()
        pool = self._aclient.client._executor()
        return await loop.run_in_executor(pool, lambda: fn(*args, **kw))

    async def exec(self, argv=None, **kw) -> ExecResult:
        return await self._run(self.sync.exec, argv, **kw)

    async def run_shell(self, command, **kw) -> ExecResult:
        return await self._run(self.sync.run_shell, command, **kw)

    async def fork(self, n=1) -> List["AsyncSandbox"]:
        kids = await self._run(self.sync.fork, n)
        return [AsyncSandbox(self._aclient, k) for k in kids]

    async def pause(self):
        return await self._run(self.sync.pause)

    async def resume(self):
        return await self._run(self.sync.resume)

    async def status(self) -> SandboxInfo:
        return await self._run(self.sync.status)

    async def wait_state(self, state, timeout_ms=10000):
        return await self._run(self.sync.wait_state, state, timeout_ms)

    async def snapshot(self, name) -> str:
        return await self._run(self.sync.snapshot, name)

    async def set_network(self, network) -> None:
        return await self._run(self.sync.set_network, network)

    async def set_timeout(self, seconds) -> float:
        return await self._run(self.sync.set_timeout, seconds)

    async def stop(self):
        return await self._run(self.sync.stop)


class AsyncDSecClient:
    """The asyncio interface. Creates are truly asynchronous (many in flight
    from one event loop, no thread per create); other operations run on the
    client's thread pool.

        async with AsyncDSecClient(url=...) as c:
            sbs = await asyncio.gather(*(c.run_function(memory_mb=256) for _ in range(100)))
    """

    def __init__(self, url: Optional[str] = None, client: Optional[DSecClient] = None, **kw):
        self._own = client is None
        self.client = client if client is not None else DSecClient(url=url, open=False, **kw)

    async def open(self) -> "AsyncDSecClient":
        if self.client.closed:
            await asyncio.get_running_loop().run_in_executor(None, self.client.open)
        return self

    async def close(self) -> None:
        if self._own:
            await asyncio.get_running_loop().run_in_executor(None, self.client.close)

    async def __aenter__(self):
        return await self.open()

    async def __aexit__(self, *exc):
        await self.close()

    async def run(self, type: Optional[str] = None, args: Optional[SandboxArgs] = None,
                  **kw) -> AsyncSandbox:
        a = args if args is not None and not kw else _args(args, SandboxArgs, kw)
        c = self.client
        info = await c.create_future(type, a)
        return AsyncSandbox(self, Sandbox(c, info, a.user, a.rollout_id))

    async def run_function(self, args: Optional[FunctionArgs] = None, **kw) -> AsyncSandbox:
        return await self.run("function", _args(args, FunctionArgs, kw))

    async def run_container(self, args: Optional[ContainerArgs] = None, **kw) -> AsyncSandbox:
        return await self.run("container", _args(args, ContainerArgs, kw))

    async def run_microvm(self, args: Optional[MicroVMArgs] = None, **kw) -> AsyncSandbox:
        return await self.run("microvm", _args(args, MicroVMArgs, kw))

    async def run_vm(self, args: Optional[VMArgs] = None, **kw) -> AsyncSandbox:
        return await self.run("vm", _args(args, VMArgs, kw))

    def sandbox(self, id: str, **kw) -> AsyncSandbox:
        return AsyncSandbox(self, self.client.sandbox(id, **kw))
