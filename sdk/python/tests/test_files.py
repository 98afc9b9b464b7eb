"""Files of every size through the SDK and the CLI, in every sandbox type that has files.

setUpModule starts `dsec up --config` with a sim node and, as root, a native node offering
function, container and microVM sandboxes on busybox:1 (built as test_container.py builds it;
its tearDownModule stops and checks everything). Each size (0 B, 1 B, 4 MiB - 1, 4 MiB,
4 MiB + 1, 100 MiB, 1 GiB) is written with the SDK and read back with `dsec cp`, and written
with `dsec cp` and read back with the SDK: the bytes must be the same. A read of a file over
4 MiB used to return its first 4 MiB as the whole file. Environment as test_sdk.py.
"""
import hashlib
import os
import subprocess
import tempfile
import unittest

import embedded
from dsec import ContainerArgs, DSecClient, FunctionArgs, MicroVMArgs, NotFound, SandboxArgs
from test_container import ROOT, _cell, start_cell, tearDownModule  # noqa: F401 (the teardown)

MIB = 1 << 20
SIZES = [0, 1, 4 * MIB - 1, 4 * MIB, 4 * MIB + 1, 100 * MIB, 1024 * MIB]
ENV = "busybox:1"
# every sandbox type with files: where it keeps them, and what to create (room for two 1 GiB
# files and the temporary file of a 1 GiB upload: the cell's default disk is 1 GiB, a
# function sandbox's 64 MiB)
TYPES = {
    "sim": ("/work/f", lambda c: c.run("sim", SandboxArgs(cpu=0.1, memory_mb=64, disk_mb=4096,
                                                          max_lifetime_s=1800))),
    "function": ("/work/f", lambda c: c.run_function(FunctionArgs(disk_mb=4096,
                                                                  max_lifetime_s=1800))),
    "container": ("/tmp/f", lambda c: c.run_container(ContainerArgs(
        environment=ENV, cpu=0.5, memory_mb=128, disk_mb=4096, max_lifetime_s=1800))),
    "microvm": ("/tmp/f", lambda c: c.run_microvm(MicroVMArgs(
        environment=ENV, cpu=1, memory_mb=256, disk_mb=4096, max_lifetime_s=1800))),
}
_blob = {}


def setUpModule():
    binary = embedded.binary()
    tmp = tempfile.mkdtemp(prefix="dsec-sdkfiles-")
    _cell.update(tmp=tmp, binary=binary)
    native = ""
    if os.geteuid() == 0:
        node = "sdkfiles%d-0" % os.getpid()
        _cell["node"] = node  # the teardown looks for its containers, cgroups and QEMUs
        build = subprocess.run([os.path.join(ROOT, "scripts", "build-envs.sh"), "--dsec", binary,
                                "--registry", os.path.join(tmp, "layers"), "--state-dir", tmp,
                                "--only", "busybox"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
        if build.returncode != 0:
            tearDownModule()
            raise RuntimeError("building %s failed:\n%s" % (ENV, build.stdout))
        # its own uid range (test_function: 1.7e9, test_function_bus: 1.6e9, sdk_container 1.8e9)
        native = ("  - name: %s\n"
                  "    cpu_milli: 8000\n"
                  "    memory_mb: 16384\n"
                  "    slots: 16\n"
                  "    types: [function, container, microvm]\n"
                  "    backend: native\n"
                  "    options: {function.uid_base: \"1850000000\", function.max_workers: \"4\",\n"
                  "              function.pool_python3: \"0\",\n"
                  "              function.pool_sh: \"1\", function.pool_native: \"0\"}\n" % node)
    conf = os.path.join(tmp, "cell.yaml")
    with open(conf, "w") as f:
        f.write("cell: sdkfiles\n"
                "layers: {path: %s}\n"
                "nodes:\n"
                "  - name: sdkfilesim%d-0\n"
                "    cpu_milli: 8000\n"
                "    memory_mb: 16384\n"
                "    slots: 16\n"
                "    types: [sim]\n"
                "    backend: sim\n"
                "    options: {max_disk_mb: \"4096\"}\n%s"
                % (os.path.join(tmp, "layers"), os.getpid(), native))
    start_cell(binary, conf, tmp)
    _blob["data"] = os.urandom(max(SIZES))


class TestFiles(unittest.TestCase):
    def setUp(self):
        self.c = DSecClient(url=_cell["url"], timeout_ms=60000)
        self.addCleanup(self.c.close)
        self.env = dict(os.environ, DSEC_URL=_cell["url"])

    def cp(self, src, dst):
        return subprocess.run([_cell["binary"], "cp", src, dst], env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=900)

    def roundtrip(self, t):
        if t != "sim" and os.geteuid() != 0:
            self.skipTest("%s sandboxes need root" % t)
        path, make = TYPES[t]
        sb = make(self.c)
        self.addCleanup(self.stop_quietly, sb)
        local = os.path.join(_cell["tmp"], "local-" + t)
        back = os.path.join(_cell["tmp"], "back-" + t)
        view = memoryview(_blob["data"])
        for n in SIZES:
            data = bytes(view[:n])
            want = hashlib.sha256(data).hexdigest()
            # the SDK writes, the CLI reads into a local file
            sb.files.write(path, data)
            r = self.cp("%s:%s" % (sb.id, path), back)
            self.assertEqual(r.returncode, 0, "%s, %d bytes: dsec cp out: %s" % (t, n, r.stderr))
            self.assertEqual(os.path.getsize(back), n, "%s: dsec cp read a short file" % t)
            with open(back, "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), want, "%s, %d" % (t, n))
            # the CLI writes from a local file, the SDK reads
            with open(local, "wb") as f:
                f.write(data)
            r = self.cp(local, "%s:%s.2" % (sb.id, path))
            self.assertEqual(r.returncode, 0, "%s, %d bytes: dsec cp in: %s" % (t, n, r.stderr))
            got = sb.files.read(path + ".2")
            self.assertEqual(len(got), n, "%s: files.read returned a short file" % t)
            self.assertEqual(hashlib.sha256(got).hexdigest(), want, "%s, %d" % (t, n))
            del data, got
        os.unlink(local)
        # a failed read leaves no local file behind, not a partial one
        os.unlink(back)
        r = self.cp("%s:%s.missing" % (sb.id, path), back)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"not_found", r.stderr)
        self.assertFalse(os.path.exists(back))
        self.assertEqual([e for e in os.listdir(_cell["tmp"]) if ".dsec-" in e], [])

    @staticmethod
    def stop_quietly(sb):
        try:
            sb.stop()
        except NotFound:
            pass

    def test_sim(self):
        self.roundtrip("sim")

    def test_function(self):
        self.roundtrip("function")

    def test_container(self):
        self.roundtrip("container")

    def test_microvm(self):
        self.roundtrip("microvm")

    def streams(self, t):
        """files.upload and files.download with file-like objects (a failed upload resumed
        by its id), and mkdir, stat, rename, remove."""
        if t != "sim" and os.geteuid() != 0:
            self.skipTest("%s sandboxes need root" % t)
        import io
        path, make = TYPES[t]
        sb = make(self.c)
        self.addCleanup(self.stop_quietly, sb)
        data = bytes(memoryview(_blob["data"])[:9 * MIB + 3])
        want = hashlib.sha256(data).hexdigest()
        tr = sb.files.upload(path, io.BytesIO(data), chunk_size=MIB, window=3)
        self.assertEqual((tr.size, tr.sha256), (len(data), want))
        out = io.BytesIO()
        got = sb.files.download(path, out, page_size=MIB)
        self.assertEqual(got.sha256, want)
        self.assertEqual(out.getvalue(), data)
        self.assertEqual(sb.files.download(path), data)  # no dst: the bytes

        class Breaks(io.BytesIO):  # a source that fails after 4 MiB
            def read(self, n=-1):
                if self.tell() >= 4 * MIB:
                    raise OSError("the source went away")
                return super().read(n)

        with self.assertRaises(OSError):
            sb.files.upload(path + ".r", Breaks(data), upload_id="sdk-r1", chunk_size=MIB,
                            window=1)
        held = sb.files.upload_held(path + ".r", "sdk-r1")
        self.assertGreater(held, 0)
        tr = sb.files.upload(path + ".r", io.BytesIO(data), upload_id="sdk-r1", resume=True)
        self.assertEqual((tr.resumed_from, tr.sha256), (held, want))
        self.assertEqual(hashlib.sha256(sb.files.read(path + ".r")).hexdigest(), want)

        d = os.path.dirname(path) + "/sub/deeper"
        sb.files.mkdir(d, parents=True)
        sb.files.rename(path + ".r", d + "/moved")
        st = sb.files.stat(d + "/moved")
        self.assertEqual((st.name, st.kind, st.size), ("moved", "file", len(data)))
        with self.assertRaises(NotFound):
            sb.files.stat(path + ".r")
        sb.files.remove(os.path.dirname(path) + "/sub", recursive=True)
        with self.assertRaises(NotFound):
            sb.files.stat(d)

    def test_streams_sim(self):
        self.streams("sim")

    def test_streams_function(self):
        self.streams("function")

    def test_streams_container(self):
        self.streams("container")


if __name__ == "__main__":
    unittest.main()
