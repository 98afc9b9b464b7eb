"""ctypes bindings of libdsec (include/dsec/client.h, err.h, image.h).

The library is found through $DSEC_LIB, else relative to this package
(../../build/default/client/libdsec.so from sdk/python), else the loader's
search path (libdsec.so). Only this module knows C layouts.
"""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_int, c_size_t,
                    c_uint, c_uint8, c_uint16, c_uint32, c_uint64, c_int32, c_int64,
                    c_ssize_t, c_void_p)

ERR_MSG_MAX = 1024
ID_MAX = 96
NAME_MAX = 72


class Err(Structure):
    _fields_ = [("code", c_int), ("errnum", c_int), ("msg", c_char * ERR_MSG_MAX),
                ("retry_after_ms", c_uint)]


class ClientOpts(Structure):
    _fields_ = [("url", c_char_p), ("tenant", c_char_p), ("timeout_ms", c_int),
                ("retries", c_int), ("threads", c_int), ("name", c_char_p),
                ("direct_callbacks", c_bool)]


class CreateSpec(Structure):
    _fields_ = [("type", c_char_p), ("requires", POINTER(c_char_p)), ("env", c_char_p),
                ("cpu_milli", c_uint64), ("memory_mb", c_uint64), ("disk_mb", c_uint64),
                ("ttl_s", c_uint64), ("idle_s", c_uint64), ("labels", POINTER(c_char_p)),
                ("affinity", POINTER(c_char_p)), ("cell", c_char_p), ("cls", c_char_p),
                ("priority", c_int64), ("rollout_id", c_char_p), ("net", POINTER(c_char_p)),
                ("req_id", c_char_p), ("pausable", c_bool), ("project", c_char_p)]


class SandboxInfo(Structure):
    _fields_ = [("id", c_char * ID_MAX), ("node", c_char * NAME_MAX), ("type", c_char * 32),
                ("state", c_char * 16), ("cell", c_char * NAME_MAX), ("existing", c_bool)]


class ExecOpts(Structure):
    _fields_ = [("argv", POINTER(c_char_p)), ("env", POINTER(c_char_p)), ("cwd", c_char_p),
                ("stdin_data", c_void_p), ("stdin_len", c_size_t), ("timeout_ms", c_uint64),
                ("user", c_char_p), ("rollout_id", c_char_p), ("step", c_uint64),
                ("output_max", c_uint64), ("req_id", c_char_p), ("session", c_uint64)]


class ExecReply(Structure):
    _fields_ = [("exit_code", c_int), ("signal", c_int), ("timed_out", c_bool),
                ("out", POINTER(c_uint8)), ("out_len", c_size_t), ("out_truncated", c_bool),
                ("err_out", POINTER(c_uint8)), ("err_len", c_size_t), ("err_truncated", c_bool),
                ("duration_us", c_uint64), ("cpu_us", c_uint64), ("peak_rss_kb", c_uint64),
                ("interrupted", c_bool), ("session_ended", c_bool)]


class WriteOpts(Structure):
    _fields_ = [("mode", c_uint), ("append", c_bool), ("rollout_id", c_char_p),
                ("step", c_uint64)]


class UploadOpts(Structure):
    _fields_ = [("mode", c_uint), ("upload_id", c_char_p), ("resume", c_bool),
                ("chunk", c_size_t), ("window", c_uint)]


class DownloadOpts(Structure):
    _fields_ = [("page", c_size_t), ("window", c_uint)]


class TransferResult(Structure):
    _fields_ = [("size", c_uint64), ("sha256", c_char * 65), ("upload_id", c_char * 65),
                ("resumed_from", c_uint64)]


# dsec_upload_read_fn, dsec_file_page_fn
UPLOAD_READ = CFUNCTYPE(c_ssize_t, c_void_p, c_void_p, c_size_t)
PAGE_FN = CFUNCTYPE(c_int, c_void_p, POINTER(c_uint8), c_size_t, c_uint64)


class Dirent(Structure):
    _fields_ = [("name", c_char_p), ("kind", c_char * 8), ("size", c_uint64), ("mode", c_uint64),
                ("mtime", c_int64)]


class Proc(Structure):
    _fields_ = [("handle", c_uint64), ("pid", c_int32), ("running", c_bool),
                ("stdin_open", c_bool), ("timed_out", c_bool), ("exit_code", c_int32),
                ("signal", c_int32), ("started_ns", c_uint64), ("ended_ns", c_uint64),
                ("out_total", c_uint64), ("err_total", c_uint64), ("cmdline", c_char * 256),
                ("pty", c_bool), ("session", c_bool), ("busy", c_bool)]


class ProcOpts(Structure):
    _fields_ = [("argv", POINTER(c_char_p)), ("env", POINTER(c_char_p)), ("cwd", c_char_p),
                ("user", c_char_p), ("timeout_ms", c_uint64), ("ring_max", c_uint64),
                ("keep_stdin", c_bool), ("stdin_data", c_void_p), ("stdin_len", c_size_t),
                ("pty", c_bool), ("rows", c_uint16), ("cols", c_uint16)]


class ProcOut(Structure):
    _fields_ = [("info", Proc), ("out", POINTER(c_uint8)), ("err", POINTER(c_uint8)),
                ("out_len", c_size_t), ("err_len", c_size_t), ("out_from", c_uint64),
                ("err_from", c_uint64)]


# void (*)(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
CREATE_CB = CFUNCTYPE(None, c_int, POINTER(SandboxInfo), POINTER(Err), c_void_p)


def _candidates():
    env = os.environ.get("DSEC_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    return [os.path.join(root, "build", "default", "client", "libdsec.so"),
            os.path.join(root, "build", "bench", "client", "libdsec.so"),
            "libdsec.so"]


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("dsec: cannot load libdsec.so (build it with `make`, or set DSEC_LIB); "
                      "tried: " + "; ".join(tried))


lib, path = _load()


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


P = c_void_p  # dsec_client *
PErr = POINTER(Err)

client_connect = _proto("dsec_client_connect", c_int, POINTER(c_void_p), POINTER(ClientOpts), PErr)
client_free = _proto("dsec_client_free", None, P)
client_tenant = _proto("dsec_client_tenant", c_char_p, P)
create = _proto("dsec_create", c_int, P, POINTER(CreateSpec), POINTER(SandboxInfo), PErr)
create_async = _proto("dsec_create_async", c_int, P, POINTER(CreateSpec), CREATE_CB, c_void_p, PErr)
exec_ = _proto("dsec_exec", c_int, P, c_char_p, POINTER(ExecOpts), POINTER(ExecReply), PErr)
exec_reply_release = _proto("dsec_exec_reply_release", None, POINTER(ExecReply))
file_write_ex = _proto("dsec_file_write_ex", c_int, P, c_char_p, c_char_p, c_void_p, c_size_t,
                       POINTER(WriteOpts), PErr)
file_read = _proto("dsec_file_read", c_int, P, c_char_p, c_char_p, POINTER(POINTER(c_uint8)),
                   POINTER(c_size_t), PErr)
file_list = _proto("dsec_file_list", c_int, P, c_char_p, c_char_p, POINTER(POINTER(Dirent)),
                   POINTER(c_size_t), PErr)
dirents_free = _proto("dsec_dirents_free", None, POINTER(Dirent), c_size_t)
file_upload = _proto("dsec_file_upload", c_int, P, c_char_p, c_char_p, POINTER(UploadOpts),
                     UPLOAD_READ, c_void_p, POINTER(TransferResult), PErr)
file_upload_held = _proto("dsec_file_upload_held", c_int, P, c_char_p, c_char_p, c_char_p,
                          POINTER(c_uint64), PErr)
file_download = _proto("dsec_file_download", c_int, P, c_char_p, c_char_p, POINTER(DownloadOpts),
                       PAGE_FN, c_void_p, POINTER(TransferResult), PErr)
file_mkdir = _proto("dsec_file_mkdir", c_int, P, c_char_p, c_char_p, c_uint, c_bool, PErr)
file_stat = _proto("dsec_file_stat", c_int, P, c_char_p, c_char_p, POINTER(Dirent), PErr)
file_rename = _proto("dsec_file_rename", c_int, P, c_char_p, c_char_p, c_char_p, PErr)
file_remove = _proto("dsec_file_remove", c_int, P, c_char_p, c_char_p, c_bool, PErr)
fork = _proto("dsec_fork", c_int, P, c_char_p, c_uint, POINTER(POINTER(c_char_p)),
              POINTER(c_size_t), PErr)
strv_free = _proto("dsec_strv_free", None, POINTER(c_char_p), c_size_t)
pause = _proto("dsec_pause", c_int, P, c_char_p, PErr)
# containers only; an older libdsec without it makes Sandbox.snapshot raise NotSupported
snapshot = (_proto("dsec_snapshot", c_int, P, c_char_p, c_char_p, PErr)
            if hasattr(lib, "dsec_snapshot") else None)
set_network = (_proto("dsec_set_network", c_int, P, c_char_p, POINTER(c_char_p), c_size_t, PErr)
               if hasattr(lib, "dsec_set_network") else None)
set_ttl = (_proto("dsec_set_ttl", c_int, P, c_char_p, c_uint64, POINTER(c_uint64), PErr)
           if hasattr(lib, "dsec_set_ttl") else None)
# background processes; an older libdsec without them makes Sandbox.processes raise NotSupported
if hasattr(lib, "dsec_proc_start"):
    proc_start = _proto("dsec_proc_start", c_int, P, c_char_p, POINTER(ProcOpts), POINTER(Proc),
                        PErr)
    proc_list = _proto("dsec_proc_list", c_int, P, c_char_p, POINTER(POINTER(Proc)),
                       POINTER(c_size_t), PErr)
    proc_signal = _proto("dsec_proc_signal", c_int, P, c_char_p, c_uint64, c_int, PErr)
    proc_write = _proto("dsec_proc_write", c_int, P, c_char_p, c_uint64, c_void_p, c_size_t,
                        c_bool, PErr)
    proc_read = _proto("dsec_proc_read", c_int, P, c_char_p, c_uint64, c_uint64, c_uint64,
                       c_uint64, POINTER(ProcOut), PErr)
    proc_out_free = _proto("dsec_proc_out_free", None, POINTER(ProcOut))
else:
    proc_start = None
# terminals and shell sessions (and reads that wait for output)
if hasattr(lib, "dsec_session_start"):
    proc_read_wait = _proto("dsec_proc_read_wait", c_int, P, c_char_p, c_uint64, c_uint64,
                            c_uint64, c_uint64, c_uint32, POINTER(ProcOut), PErr)
    proc_resize = _proto("dsec_proc_resize", c_int, P, c_char_p, c_uint64, c_uint16, c_uint16,
                         PErr)
    session_start = _proto("dsec_session_start", c_int, P, c_char_p, c_char_p, POINTER(Proc),
                           PErr)
    session_interrupt = _proto("dsec_session_interrupt", c_int, P, c_char_p, c_uint64, PErr)
    dir_watch = _proto("dsec_dir_watch", c_int, P, c_char_p, c_char_p, c_bool, POINTER(Proc),
                       PErr)
else:
    proc_read_wait = proc_resize = session_start = session_interrupt = dir_watch = None
resume = _proto("dsec_resume", c_int, P, c_char_p, PErr)
destroy = _proto("dsec_destroy", c_int, P, c_char_p, PErr)
status = _proto("dsec_status", c_int, P, c_char_p, POINTER(SandboxInfo), PErr)
wait_state = _proto("dsec_wait_state", c_int, P, c_char_p, c_char_p, c_int, PErr)
free = _proto("dsec_free", None, c_void_p)
code_name = _proto("dsec_code_name", c_char_p, c_int)
code_retry_safe = _proto("dsec_code_retry_safe", c_bool, c_int)


def strv(items):
    """A NULL-terminated char*[] from a list of str (None for an empty list).
    The returned array keeps its bytes alive."""
    if not items:
        return None
    enc = [s.encode() if isinstance(s, str) else bytes(s) for s in items]
    arr = (c_char_p * (len(enc) + 1))(*enc, None)
    arr._keep = enc
    return arr


def cstr(s):
    if s is None:
        return None
    return s.encode() if isinstance(s, str) else bytes(s)


# completion queues (client.h, "added for the SDKs")
class CqEvent(Structure):
    _fields_ = [("token", c_uint64), ("status", c_int), ("info", SandboxInfo), ("err", Err)]


HAVE_CQ = hasattr(lib, "dsec_create_cq")
if HAVE_CQ:
    cq_new = _proto("dsec_cq_new", c_int, POINTER(c_void_p), PErr)
    cq_free = _proto("dsec_cq_free", None, c_void_p)
    cq_fd = _proto("dsec_cq_fd", c_int, c_void_p)
    cq_poll = _proto("dsec_cq_poll", c_size_t, c_void_p, POINTER(CqEvent), c_size_t)
    create_cq = _proto("dsec_create_cq", c_int, P, POINTER(CreateSpec), c_void_p, c_uint64, PErr)
# every create of one event-loop turn in one call (an older libdsec: one call each)
HAVE_CQ_BATCH = HAVE_CQ and hasattr(lib, "dsec_cq_create_batch")
if HAVE_CQ_BATCH:
    cq_create_batch = _proto("dsec_cq_create_batch", c_int, c_void_p, P, POINTER(c_void_p),
                             POINTER(c_uint64), c_size_t, PErr)


def _event_struct():
    """A struct.Struct reading one CqEvent as (token, status, id, place,
    existing), place being the raw node, type, state and cell fields (one
    span of bytes; INFO_PLACE slices it): iter_unpack over a copy of the
    polled events decodes a whole batch in C instead of one ctypes attribute
    at a time, and the place is decoded once for every answer that shares
    it."""
    import struct
    fmt, at = "<", 0

    def field(offset, code, size):
        nonlocal fmt, at
        fmt += "%dx" % (offset - at) if offset > at else ""
        fmt += code
        at = offset + size

    info = CqEvent.info.offset
    field(CqEvent.token.offset, "Q", 8)
    field(CqEvent.status.offset, "i", 4)
    field(info + SandboxInfo.id.offset, "%ds" % SandboxInfo.id.size, SandboxInfo.id.size)
    first, last = SandboxInfo.node, SandboxInfo.cell
    span = last.offset + last.size - first.offset
    field(info + first.offset, "%ds" % span, span)
    field(info + SandboxInfo.existing.offset, "?", 1)
    fmt += "%dx" % (ctypes.sizeof(CqEvent) - at)
    st = struct.Struct(fmt)
    assert st.size == ctypes.sizeof(CqEvent)
    places = []
    for name in ("node", "type", "state", "cell"):
        f = getattr(SandboxInfo, name)
        places.append((f.offset - first.offset, f.offset - first.offset + f.size))
    return st, tuple(places)


# CQ_EVENT: the struct of one event; INFO_PLACE: (start, end) of node, type,
# state and cell within its place field
CQ_EVENT, INFO_PLACE = _event_struct()


# images (image.h): import, pull, list, get, remove in a layer registry. An older libdsec
# without them leaves HAVE_IMAGES false and dsec.images runs the `dsec` command line instead.
DIGEST_LEN = 72  # dsec_digest: "sha256:" + 64 hex + NUL
IMAGE_PROGRESS = CFUNCTYPE(None, c_void_p, c_char_p)


class ImageLayer(Structure):
    _fields_ = [("diff_id", c_char * DIGEST_LEN), ("layer", c_char * DIGEST_LEN),
                ("size", c_uint64), ("reused", c_bool)]


class ImageInfo(Structure):
    _fields_ = [("ref", c_char_p), ("manifest", c_char * DIGEST_LEN),
                ("config", c_char * DIGEST_LEN), ("env", c_char_p),
                ("layers", POINTER(ImageLayer)), ("nlayers", c_size_t),
                ("cmd", POINTER(c_char_p)), ("ncmd", c_size_t),
                ("labels", POINTER(c_char_p)), ("nlabels", c_size_t),
                ("created_unix", c_int64)]


class ImageImportOpts(Structure):
    _fields_ = [("ref", c_char_p), ("format", c_int), ("platform", c_char_p),
                ("work_dir", c_char_p), ("progress", IMAGE_PROGRESS), ("progress_arg", c_void_p)]


class ImagePullOpts(Structure):
    _fields_ = [("import_", ImageImportOpts), ("username", c_char_p), ("password", c_char_p),
                ("auth_file", c_char_p), ("ca_file", c_char_p), ("plain_http", c_bool),
                ("timeout_s", c_uint)]


HAVE_IMAGES = all(hasattr(lib, n) for n in (
    "dsec_layer_registry_open", "dsec_layer_registry_free", "dsec_layer_format_parse",
    "dsec_image_import", "dsec_image_pull", "dsec_image_list", "dsec_image_get",
    "dsec_image_remove", "dsec_image_info_free", "dsec_image_infos_free"))
if HAVE_IMAGES:
    PInfo = POINTER(ImageInfo)
    layer_registry_open = _proto("dsec_layer_registry_open", c_int, POINTER(c_void_p), c_char_p,
                                 PErr)
    layer_registry_free = _proto("dsec_layer_registry_free", None, c_void_p)
    layer_format_parse = _proto("dsec_layer_format_parse", c_int, c_char_p, POINTER(c_int), PErr)
    image_import = _proto("dsec_image_import", c_int, c_void_p, c_char_p,
                          POINTER(ImageImportOpts), POINTER(PInfo), PErr)
    image_pull = _proto("dsec_image_pull", c_int, c_void_p, c_char_p, POINTER(ImagePullOpts),
                        POINTER(PInfo), PErr)
    image_list = _proto("dsec_image_list", c_int, c_void_p, POINTER(PInfo), POINTER(c_size_t),
                        PErr)
    image_get = _proto("dsec_image_get", c_int, c_void_p, c_char_p, POINTER(PInfo), PErr)
    image_remove = _proto("dsec_image_remove", c_int, c_void_p, c_char_p, PErr)
    image_info_free = _proto("dsec_image_info_free", None, PInfo)
    image_infos_free = _proto("dsec_image_infos_free", None, PInfo, c_size_t)


def image_dict(i):
    """A dsec_image_info as `dsec image inspect --json` prints it."""
    def s(b):
        return b.decode(errors="replace") if b is not None else None
    return {"ref": s(i.ref), "env": s(i.env), "manifest": s(i.manifest), "config": s(i.config),
            "created": int(i.created_unix),
            "layers": [{"diff_id": s(i.layers[k].diff_id), "layer": s(i.layers[k].layer),
                        "size": int(i.layers[k].size)} for k in range(i.nlayers)],
            "cmd": [s(i.cmd[k]) for k in range(i.ncmd)],
            "labels": [s(i.labels[k]) for k in range(i.nlabels)]}
