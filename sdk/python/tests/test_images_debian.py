"""Task images over the debootstrap base, made by real tools, pulled and run through the SDK.

setUpModule takes the debootstrap bookworm tree (scripts/build-envs.sh --only debootstrap,
cached in /var/cache/dsec-test), makes two task images of it with umoci, pushes them with
skopeo into Debian's docker-registry on a free loopback port, pulls them with dsec.images, and
starts `dsec up` with one container node on that layer registry:

  deb-task:1   the base layer, then a layer with a file deleted (/etc/motd), a hard link
               across directories, an absolute symlink, a setuid binary and a user of its own,
               then a layer made by hand (an opaque /etc/apt/apt.conf.d); USER agent,
               WorkingDir, Env, Entrypoint and Cmd
  deb-task2:1  the same base layer and one small layer of its own

Needs root, umoci, skopeo, docker-registry, crun and debootstrap with a reachable Debian
mirror; skipped (with the reason) otherwise. Environment as test_sdk.py: DSEC_BIN, DSEC_LIB.
"""
import io
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import unittest

import embedded
from dsec import ContainerArgs, DSecClient, NotFound
from dsec.images import Images

from embedded import ROOT

CACHE = os.environ.get("DSEC_TEST_CACHE", "/var/cache/dsec-test")
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_m = {}


def _run(argv, **kw):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError("%s exited %d:\n%s" % (" ".join(argv), r.returncode, r.stdout))
    return r.stdout


def _sh(line, cwd):
    return _run(["sh", "-ec", line], cwd=cwd)


def _debootstrap_tree(binary):
    """The cached tree, made on first use (under a lock: parallel runs share it)."""
    os.makedirs(CACHE, exist_ok=True)
    r = subprocess.run(["flock", os.path.join(CACHE, ".lock"),
                        os.path.join(ROOT, "scripts", "build-envs.sh"), "--dsec", binary,
                        "--state-dir", CACHE, "--only", "debootstrap"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if r.returncode != 0:
        raise unittest.SkipTest("no debootstrap tree (is a Debian mirror reachable?):\n" +
                                r.stdout[-2000:])
    return r.stdout.strip().splitlines()[-1]


def _opaque_layer(path):
    """An uncompressed layer tar: /etc/apt/apt.conf.d made opaque, with one file of its own."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        d = tarfile.TarInfo("etc/apt/apt.conf.d")
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        t.addfile(d)
        for name, data in (("etc/apt/apt.conf.d/.wh..wh..opq", b""),
                           ("etc/apt/apt.conf.d/99dsec", b"APT::Get::Assume-Yes \"true\";\n")):
            f = tarfile.TarInfo(name)
            f.size, f.mode = len(data), 0o644
            t.addfile(f, io.BytesIO(data))
    with open(path, "wb") as f:
        f.write(raw.getvalue())


def _own_layer(path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        data = b"task two\n"
        f = tarfile.TarInfo("own.txt")
        f.size, f.mode = len(data), 0o644
        t.addfile(f, io.BytesIO(data))
    with open(path, "wb") as f:
        f.write(raw.getvalue())


def _make_images(tree, tmp):
    """oci:base (the tree), oci:task and oci:task2 (module docstring), in tmp/oci."""
    _run(["umoci", "init", "--layout", "oci"], cwd=tmp)
    _run(["umoci", "new", "--image", "oci:base"], cwd=tmp)
    _run(["umoci", "unpack", "--image", "oci:base", "b"], cwd=tmp)
    _run(["cp", "-a", tree + "/.", "b/rootfs/"], cwd=tmp)
    os.remove(os.path.join(tmp, "b", "rootfs", ".complete"))
    # debootstrap leaves device nodes in /dev; images have an empty one (the runtime fills it)
    _sh("find b/rootfs/dev -mindepth 1 -delete", tmp)
    _run(["umoci", "repack", "--refresh-bundle", "--image", "oci:base", "b"], cwd=tmp)
    _run(["umoci", "config", "--image", "oci:base", "--config.env", PATH], cwd=tmp)
    # the task's own layer, over the bundle of the base
    _sh("cd b/rootfs\n"
        "test -e etc/motd && rm etc/motd\n"
        "mkdir -p opt/a srv/b home/agent && echo linked > opt/a/f && ln opt/a/f srv/b/g\n"
        "ln -s /opt/a/f usr/local/bin/flink\n"
        "cp usr/bin/true usr/local/bin/suid-true && chmod 4755 usr/local/bin/suid-true\n"
        "echo 'agent:x:1234:1234::/home/agent:/bin/bash' >> etc/passwd\n"
        "echo 'agent:x:1234:' >> etc/group && chown 1234:1234 home/agent\n", tmp)
    _run(["umoci", "repack", "--image", "oci:task", "b"], cwd=tmp)
    _opaque_layer(os.path.join(tmp, "opq.tar"))
    _run(["umoci", "raw", "add-layer", "--image", "oci:task", "opq.tar"], cwd=tmp)
    _run(["umoci", "config", "--image", "oci:task", "--config.env", PATH,
          "--config.env", "GREETING=hi", "--config.user", "agent",
          "--config.workingdir", "/home/agent", "--config.entrypoint", "/bin/sh",
          "--config.entrypoint", "-c",
          "--config.cmd", 'echo "$GREETING from $(id -un) in $(pwd)"'], cwd=tmp)
    _own_layer(os.path.join(tmp, "own.tar"))
    _run(["umoci", "raw", "add-layer", "--image", "oci:base", "--tag", "task2", "own.tar"],
         cwd=tmp)


def _start_registry(tmp):
    port = embedded.free_port()
    conf = os.path.join(tmp, "registry.yml")
    with open(conf, "w") as f:
        f.write("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
                "    rootdirectory: %s/registry\nhttp:\n  addr: 127.0.0.1:%d\n" % (tmp, port))
    log = open(os.path.join(tmp, "registry.log"), "w")
    proc = subprocess.Popen(["docker-registry", "serve", conf], stdout=log,
                            stderr=subprocess.STDOUT)
    _m.update(registry=proc, registry_log=log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return port
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    raise RuntimeError("docker-registry did not start on 127.0.0.1:%d" % port)


def setUpModule():
    if os.geteuid() != 0:
        raise unittest.SkipTest("needs root (images are unpacked and containers run as root)")
    missing = [t for t in ("umoci", "skopeo", "docker-registry", "crun", "debootstrap",
                           "mkfs.erofs") if shutil.which(t) is None]
    if missing:
        raise unittest.SkipTest("needs %s (scripts/install-deps.sh installs them)"
                                % ", ".join(missing))
    binary = embedded.binary()
    tree = _debootstrap_tree(binary)
    tmp = tempfile.mkdtemp(prefix="dsec-sdkdeb-", dir="/var/tmp")
    _m.update(tmp=tmp, node="sdkdeb%d-0" % os.getpid())
    try:
        t0 = time.monotonic()
        _make_images(tree, tmp)
        port = _start_registry(tmp)
        host = "127.0.0.1:%d" % port
        _m["refs"] = (host + "/swe/deb-task:1", host + "/swe/deb-task2:1")
        for tag, ref in zip(("task", "task2"), _m["refs"]):
            _run(["skopeo", "copy", "--dest-tls-verify=false", "oci:oci:" + tag,
                  "docker://" + ref], cwd=tmp)
        imgs = Images(registry=os.path.join(tmp, "layers"))
        _m["pulled"] = [imgs.pull(ref, plain_http=True) for ref in _m["refs"]]
        _m["imgs"] = imgs
        print("images made, pushed and pulled in %.1f s" % (time.monotonic() - t0))
        conf = os.path.join(tmp, "cell.yaml")
        with open(conf, "w") as f:
            f.write("cell: sdkdeb\n"
                    "layers: {path: %s}\n"
                    "reports: {capacity_ms: 20, full_ms: 500, heartbeat_ms: 100, reap_ms: 200}\n"
                    "nodes:\n"
                    "  - name: %s\n"
                    "    cpu_milli: 4000\n"
                    "    memory_mb: 8192\n"
                    "    slots: 16\n"
                    "    types: [container]\n"
                    "    backend: native\n" % (os.path.join(tmp, "layers"), _m["node"]))
        embedded.start(_m, binary, tmp, conf=conf, teardown=tearDownModule)
    except BaseException:
        tearDownModule()
        raise


def tearDownModule():
    embedded.stop(_m, timeout=20)
    proc = _m.pop("registry", None)
    if proc is not None:
        proc.kill()
        proc.wait()
        _m.pop("registry_log").close()
    tmp = _m.pop("tmp", None)
    if tmp:
        with open("/proc/self/mountinfo") as f:
            mounts = [l.split()[4] for l in f if l.split()[4].startswith(tmp + "/")]
        for m in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)
    node = _m.pop("node", None)
    if node:
        for base in ("/sys/fs/cgroup",) + tuple(
                os.path.join("/sys/fs/cgroup", d) for d in os.listdir("/sys/fs/cgroup")):
            try:
                os.rmdir(os.path.join(base, "dsec-ct-" + node))
            except OSError:
                pass


class TestDebianImages(unittest.TestCase):
    def setUp(self):
        self.c = DSecClient(url=_m["url"], timeout_ms=30000)
        self.addCleanup(self.c.close)

    def make(self, ref):
        sb = self.c.run_container(ContainerArgs(environment=ref, cpu=0.5, memory_mb=256,
                                                max_lifetime_s=600))

        def stop():
            try:
                sb.stop()
            except NotFound:
                pass
        self.addCleanup(stop)
        return sb

    def sh(self, sb, line):
        r = sb.run_shell(line, timeout_ms=30000)
        self.assertEqual(r.exit_code, 0, "%r: %s%s" % (line, r.stdout, r.stderr))
        return r.text.rstrip("\n")

    def test_task_image_runs_as_built(self):
        sb = self.make(_m["refs"][0])
        # Entrypoint + Cmd, as the image's USER, in its WorkingDir, with its Env
        self.assertEqual(sb.exec().text, "hi from agent in /home/agent\n")
        self.assertEqual(self.sh(sb, "id -un; pwd; echo $GREETING"), "agent\n/home/agent\nhi")
        # deleted in a higher layer; an opaque directory hides what the base had there
        self.assertEqual(self.sh(sb, "test -e /etc/motd || echo absent"), "absent")
        self.assertEqual(self.sh(sb, "ls -A /etc/apt/apt.conf.d"), "99dsec")
        # one file under two directories, a symlink, a setuid binary
        self.assertEqual(self.sh(sb, "stat -c %i /opt/a/f /srv/b/g | uniq | wc -l; "
                                     "stat -c %h /srv/b/g"), "1\n2")
        self.assertEqual(self.sh(sb, "readlink /usr/local/bin/flink; cat /usr/local/bin/flink"),
                         "/opt/a/f\nlinked")
        self.assertEqual(self.sh(sb, "stat -c %a /usr/local/bin/suid-true"), "4755")
        # the Debian userland of the base works in the sandbox
        self.assertEqual(self.sh(sb, "dpkg-query -W -f='${Status}' base-files"),
                         "install ok installed")
        self.assertTrue(self.sh(sb, "apt-get --version | head -n 1").startswith("apt "))

    def test_second_image_shares_the_base(self):
        first, second = _m["pulled"]
        self.assertEqual(len(first["layers"]), 3)
        self.assertEqual(len(second["layers"]), 2)
        # the base layer is the same dsec layer, stored once: the registry holds four blobs
        self.assertEqual(first["layers"][0]["layer"], second["layers"][0]["layer"])
        held = sorted("sha256:" + b for b in
                      os.listdir(os.path.join(_m["tmp"], "layers", "blobs", "sha256"))
                      if not b.endswith(".meta"))
        want = sorted({l["layer"] for l in first["layers"] + second["layers"]})
        self.assertEqual(held, want)
        self.assertEqual(len(held), 4)
        names = [i["ref"] for i in _m["imgs"].list()]
        self.assertEqual(sorted(names), sorted(_m["refs"]))
        sb = self.make(_m["refs"][1])
        self.assertEqual(self.sh(sb, "cat /own.txt; id -un; test -e /opt/a/f || echo base only"),
                         "task two\nroot\nbase only")


if __name__ == "__main__":
    unittest.main()
