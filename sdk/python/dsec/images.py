"""Images: import, pull, build, list, inspect and remove OCI and Docker images in a layer registry.

    from dsec.images import Images
    imgs = Images(registry="/var/lib/dsec/layers")        # or "nats://host:4222"
    imgs.import_("task.tar")                               # docker save / OCI layout / OCI archive
    imgs.pull("registry.local:5000/swe/task-123:latest", ca_file="ca.pem", username="u",
              password="p")
    imgs.build("./ctx", "swe/task-7:1", build_args={"PY": "3"}, url="nats://127.0.0.1:4222")
    [i["ref"] for i in imgs.list()]
    client.run("container", environment="registry.local:5000/swe/task-123:latest")

libdsec (the client library the rest of the SDK loads) does not link the importer, so these
calls run the `dsec` command line (docs/images.md): $DSEC_BIN, else the build next to this
source tree, else `dsec` on PATH. Every call returns what `dsec image inspect --json` prints
for the image it touched, and raises DSecError (InvalidArgument for usage errors) with the
command's own message on failure.
"""
import json
import os
import shutil
import subprocess

import re

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
        self.cli = cli or _cli()

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
        return json.loads(self._run("inspect", ["inspect", ref, "--json"] + self._where()))

    def list(self):
        """Every image's record, sorted by reference."""
        return json.loads(self._run("ls", ["ls", "--json"] + self._where()))

    def remove(self, ref):
        """Remove the image, its environment and the layers nothing else holds."""
        self._run("rm", ["rm", ref] + self._where())

    def import_(self, path, name=None, format=None, work_dir=None):
        """Import a `docker save` archive, an OCI layout directory or an OCI archive."""
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
        The password goes on the command's stdin, never its arguments."""
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
