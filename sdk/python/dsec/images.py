"""Images: import, pull, build, list, inspect and remove OCI and Docker images in a layer registry.

    from dsec.images import Images
    imgs = Images(registry="/var/lib/dsec/layers")        # or "nats://host:4222"
    imgs.import_("task.tar")                               # docker save / OCI layout / OCI archive
    imgs.pull("registry.local:5000/swe/task-123:latest", ca_file="ca.pem", username="u",
              password="p")
    imgs.build("./ctx", "swe/task-7:1", build_args={"PY": "3"}, url="nats://127.0.0.1:4222")
    [i["ref"] for i in imgs.list()]
    client.run("container", environment="registry.local:5000/swe/task-123:latest")

import, pull, list, inspect and remove are calls into libdsec (dsec/image.h, through _lib): the
registry is opened for each call and closed after it. build runs the `dsec` command line
(docs/images.md), as every call does with an older libdsec that lacks the image calls: $DSEC_BIN,
else the build next to this source tree, else `dsec` on PATH. Every call returns what
`dsec image inspect --json` prints for the image it touched, and raises DSecError
(InvalidArgument for bad input) with the library's or the command's message on failure.
"""
import contextlib
import ctypes
import json
import os
import re
import shutil
import subprocess

from . import _lib, errors
from .errors import _CLASSES, DSecError, InvalidArgument


def _cli():
    for var in ("DSEC_BIN", "DSEC_CLI"):
        if os.environ.get(var):
            return os.environ[var]
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    built = os.path.join(root, "build", "default", "tools", "dsec")
    if os.path.exists(built):
        return built
    found = shutil.which("dsec")
    if found:
        return found
    raise DSecError("dsec: the `dsec` command is not found (build it with `make`, or set DSEC_BIN)",
                    code="config")


class Images:
    """The images of one layer registry: registry is a directory or nats://HOST:PORT[?bucket=B]
    (None: $DSEC_LAYERS, else state_dir/layers, as the dsec command line picks)."""

    def __init__(self, registry=None, state_dir=None, cli=None):
        if registry is None and state_dir is not None:
            registry = os.path.join(str(state_dir), "layers")
        self.registry = registry
        self._cli = cli
        self.use_lib = _lib.HAVE_IMAGES  # False: every call runs the command line

    @property
    def cli(self):
        """The `dsec` binary build (and the older-libdsec fallback) runs; found when first
        needed."""
        if self._cli is None:
            self._cli = _cli()
        return self._cli

    # ---- through libdsec --------------------------------------------------------------------

    def _location(self):
        """Where the command line would look: the registry, else $DSEC_LAYERS, else
        ./state/layers."""
        if self.registry is not None:
            return str(self.registry)
        return os.environ.get("DSEC_LAYERS") or os.path.join("state", "layers")

    @contextlib.contextmanager
    def _open(self, op):
        h = ctypes.c_void_p()
        err = _lib.Err()
        if _lib.layer_registry_open(ctypes.byref(h), _lib.cstr(self._location()),
                                    ctypes.byref(err)) < 0:
            raise errors.from_err(err, "image " + op)
        try:
            yield h
        finally:
            _lib.layer_registry_free(h)

    @staticmethod
    def _format(fmt, op):
        if not fmt:
            return 0
        v = ctypes.c_int(0)
        err = _lib.Err()
        if _lib.layer_format_parse(_lib.cstr(fmt), ctypes.byref(v), ctypes.byref(err)) < 0:
            raise errors.from_err(err, "image " + op)
        return v.value

    @staticmethod
    def _taken(p):
        """The dict of a dsec_image_info the library returned, which is freed."""
        try:
            return _lib.image_dict(p.contents)
        finally:
            _lib.image_info_free(p)

    def _lib_get(self, op, ref):
        with self._open(op) as r:
            p = _lib.PInfo()
            err = _lib.Err()
            if _lib.image_get(r, _lib.cstr(ref), ctypes.byref(p), ctypes.byref(err)) < 0:
                raise errors.from_err(err, "image " + op)
            return self._taken(p)

    # ---- the calls --------------------------------------------------------------------------

    def _where(self):
        args = []
        if self.registry is not None:
            args += ["--registry", str(self.registry)]
        return args

    def _run(self, op, args, stdin=None, env=None, timeout=None):
        try:
            p = subprocess.run([self.cli, "image"] + args, input=stdin, capture_output=True,
                               env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DSecError("dsec image %s: no answer within %s s" % (op, timeout), code="timeout",
                            op=op)
        if p.returncode != 0:
            lines = [l for l in p.stderr.decode(errors="replace").splitlines() if l.strip()]
            msg = lines[-1] if lines else "dsec image %s exited %d" % (op, p.returncode)
            # the command line ends its message with "(code[, safe to retry])"
            m = re.search(r" \(([a-z_]+)(, safe to retry)?\)$", msg)
            code = m.group(1) if m else ("invalid" if p.returncode == 2 else "backend")
            if m:
                msg = msg[:m.start()]
            cls = _CLASSES.get(code, InvalidArgument if p.returncode == 2 else DSecError)
            raise cls(msg, code=code, retry_safe=bool(m and m.group(2)), op=op)
        return p.stdout.decode()

    def inspect(self, ref):
        """The image's record: ref, env, manifest, config, created, layers (diff_id, layer,
        size), cmd, labels."""
        if self.use_lib:
            return self._lib_get("inspect", ref)
        return json.loads(self._run("inspect", ["inspect", ref, "--json"] + self._where()))

    def list(self):
        """Every image's record, sorted by reference."""
        if self.use_lib:
            with self._open("ls") as r:
                v, n = _lib.PInfo(), ctypes.c_size_t(0)
                err = _lib.Err()
                if _lib.image_list(r, ctypes.byref(v), ctypes.byref(n), ctypes.byref(err)) < 0:
                    raise errors.from_err(err, "image ls")
                try:
                    return [_lib.image_dict(v[k]) for k in range(n.value)]
                finally:
                    _lib.image_infos_free(v, n)
        return json.loads(self._run("ls", ["ls", "--json"] + self._where()))

    def remove(self, ref):
        """Remove the image, its environment and the layers nothing else holds."""
        if self.use_lib:
            with self._open("rm") as r:
                err = _lib.Err()
                if _lib.image_remove(r, _lib.cstr(ref), ctypes.byref(err)) < 0:
                    raise errors.from_err(err, "image rm")
            return
        self._run("rm", ["rm", ref] + self._where())

    def import_(self, path, name=None, format=None, work_dir=None):
        """Import a `docker save` archive, an OCI layout directory or an OCI archive."""
        if self.use_lib:
            o = _lib.ImageImportOpts(ref=_lib.cstr(name), format=self._format(format, "import"),
                                     work_dir=_lib.cstr(str(work_dir) if work_dir else None))
            with self._open("import") as r:
                p = _lib.PInfo()
                err = _lib.Err()
                if _lib.image_import(r, _lib.cstr(str(path)), ctypes.byref(o), ctypes.byref(p),
                                     ctypes.byref(err)) < 0:
                    raise errors.from_err(err, "image import")
                return self._taken(p)
        args = ["import", str(path)] + self._where()
        if name:
            args += ["--name", name]
        if format:
            args += ["--format", format]
        if work_dir:
            args += ["--work-dir", str(work_dir)]
        ref = self._run("import", args).strip().splitlines()[-1]
        return self.inspect(ref)

    def pull(self, ref, username=None, password=None, auth_file=None, ca_file=None,
             plain_http=False, format=None, timeout_s=None):
        """Pull HOST[:PORT]/REPO[:TAG|@sha256:...] over the registry HTTP API v2 and import it.
        The password goes to libdsec in memory (or on the command's stdin), never in a
        command's arguments."""
        if password is not None and not username:
            raise InvalidArgument("image pull: a password needs a username", code="invalid",
                                  op="pull")
        if self.use_lib:
            o = _lib.ImagePullOpts(username=_lib.cstr(username), password=_lib.cstr(password),
                                   auth_file=_lib.cstr(str(auth_file) if auth_file else None),
                                   ca_file=_lib.cstr(str(ca_file) if ca_file else None),
                                   plain_http=bool(plain_http),
                                   timeout_s=int(timeout_s) if timeout_s else 0)
            o.import_.format = self._format(format, "pull")
            with self._open("pull") as r:
                p = _lib.PInfo()
                err = _lib.Err()
                if _lib.image_pull(r, _lib.cstr(ref), ctypes.byref(o), ctypes.byref(p),
                                   ctypes.byref(err)) < 0:
                    msg = err.msg.decode(errors="replace")
                    if ref not in msg:  # say which image, as the command line does
                        err.msg = ("%s: %s" % (ref, msg)).encode()[:_lib.ERR_MSG_MAX - 1]
                    raise errors.from_err(err, "image pull")
                return self._taken(p)
        args = ["pull", ref] + self._where()
        if username:
            args += ["--user", username]
        if password is not None:
            args += ["--password-stdin"]
        if auth_file:
            args += ["--auth-file", str(auth_file)]
        if ca_file:
            args += ["--ca-file", str(ca_file)]
        if plain_http:
            args += ["--plain-http"]
        if format:
            args += ["--format", format]
        if timeout_s:
            args += ["--timeout", str(int(timeout_s))]
        out = self._run("pull", args, stdin=(password + "\n").encode() if password else None)
        pulled = [l.split(None, 1)[1] for l in out.splitlines() if l.startswith("pulled ")]
        return self.inspect(pulled[0] if pulled else ref)

    def build(self, context, name, dockerfile=None, build_args=None, target=None, url=None,
              timeout_s=None, quiet=True):
        """Build a Dockerfile in containers of the cell at url (else $DSEC_URL) into image
        `name`; the registry must be the cell's."""
        args = ["build", "--name", name] + self._where()
        if dockerfile:
            args += ["-f", str(dockerfile)]
        for k, v in (build_args or {}).items():
            args += ["--build-arg", "%s=%s" % (k, v)]
        if target:
            args += ["--target", target]
        if timeout_s:
            args += ["--timeout", str(int(timeout_s))]
        if quiet:
            args += ["--quiet"]
        env = dict(os.environ)
        if url:
            env["DSEC_URL"] = url
        self._run("build", args + [str(context)], env=env)
        return self.inspect(name)
