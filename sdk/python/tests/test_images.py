"""dsec.images against a registry directory, through libdsec and through the real `dsec`
command line (its fallback): an OCI layout written here is imported, listed, inspected and
removed; a corrupted one and a pull from a port nothing listens on raise with a message naming
them; both ways give the same records. Needs root (whiteouts and xattrs are written as root);
skipped otherwise. Environment: DSEC_LIB (libdsec.so), DSEC_BIN (the dsec binary)."""
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import unittest

from dsec import DSecError, InvalidArgument, _lib
from dsec.images import Images


def _blob(root, data):
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(root, "blobs", "sha256", d[7:]), "wb") as f:
        f.write(data)
    return d, len(data)


def write_layout(root, files, env):
    """An OCI layout of one gzip'd layer holding files {path: bytes}, its config saying env."""
    os.makedirs(os.path.join(root, "blobs", "sha256"))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path, data in sorted(files.items()):
            ti = tarfile.TarInfo(path)
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    tar = raw.getvalue()
    layer, lsize = _blob(root, gzip.compress(tar, mtime=0))
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": env, "Cmd": ["cat", "/hello"], "Labels": {"sdk": "yes"}},
              "rootfs": {"type": "layers",
                         "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]}}
    cfg, csize = _blob(root, json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": cfg, "size": csize},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": layer, "size": lsize}]}
    man, msize = _blob(root, json.dumps(manifest).encode())
    with open(os.path.join(root, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man,
             "size": msize, "annotations": {"org.opencontainers.image.ref.name": "1"}}]}, f)
    return layer


@unittest.skipUnless(os.geteuid() == 0, "needs root (image layers are unpacked as root)")
class TestImages(unittest.TestCase):
    USE_LIB = True

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dsec-sdk-images-")
        self.imgs = Images(registry=os.path.join(self.tmp, "layers"))
        if not self.USE_LIB:
            self.imgs.use_lib = False
        elif not _lib.HAVE_IMAGES:
            self.skipTest("this libdsec.so has no image calls")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_import_list_inspect_remove(self):
        lay = os.path.join(self.tmp, "oci")
        write_layout(lay, {"hello": b"hi\n", "etc/motd": b"m\n"}, ["PATH=/bin", "A=1"])
        got = self.imgs.import_(lay, name="127.0.0.1:5000/sdk/hello:1")
        self.assertEqual(got["ref"], "127.0.0.1:5000/sdk/hello:1")
        self.assertEqual(got["env"], "127.0.0.1:5000/sdk/hello:1")
        self.assertEqual(got["cmd"], ["cat", "/hello"])
        self.assertIn("sdk=yes", got["labels"])
        self.assertEqual(len(got["layers"]), 1)
        self.assertEqual([i["ref"] for i in self.imgs.list()], ["127.0.0.1:5000/sdk/hello:1"])
        self.assertEqual(self.imgs.inspect("127.0.0.1:5000/sdk/hello:1")["manifest"],
                         got["manifest"])
        self.imgs.remove("127.0.0.1:5000/sdk/hello:1")
        self.assertEqual(self.imgs.list(), [])
        with self.assertRaises(DSecError) as cm:
            self.imgs.inspect("127.0.0.1:5000/sdk/hello:1")
        self.assertIn("127.0.0.1:5000/sdk/hello", str(cm.exception))

    def test_bad_input_raises(self):
        lay = os.path.join(self.tmp, "bad")
        layer = write_layout(lay, {"x": b"x\n"}, [])
        with open(os.path.join(lay, "blobs", "sha256", layer[7:]), "r+b") as f:
            f.seek(20)
            f.write(b"\xff\xff\xff")  # the blob no longer matches its digest
        with self.assertRaises(DSecError) as cm:
            self.imgs.import_(lay, name="sdk/bad:1")
        self.assertIn("sdk/bad:1", str(cm.exception))
        self.assertEqual(self.imgs.list(), [])  # nothing half-imported
        with self.assertRaises(DSecError) as cm:
            self.imgs.pull("127.0.0.1:1/sdk/none:1", plain_http=True, timeout_s=5)
        self.assertIn("127.0.0.1:1", str(cm.exception))
        with self.assertRaises(InvalidArgument):
            self.imgs.import_(os.path.join(self.tmp, "missing"), format="squashfs")


class TestImagesCli(TestImages):
    """The same through the command line, as with a libdsec.so without the image calls."""
    USE_LIB = False


@unittest.skipUnless(os.geteuid() == 0, "needs root (image layers are unpacked as root)")
@unittest.skipUnless(_lib.HAVE_IMAGES, "this libdsec.so has no image calls")
class TestImagesLibOnly(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dsec-sdk-images-")
        self.reg = os.path.join(self.tmp, "layers")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_no_command_needed_and_same_records(self):
        lay = os.path.join(self.tmp, "oci")
        write_layout(lay, {"hello": b"hi\n"}, ["PATH=/bin"])
        # a `dsec` that does not exist: import, list and inspect never run it
        imgs = Images(registry=self.reg, cli=os.path.join(self.tmp, "no-such-dsec"))
        got = imgs.import_(lay, name="sdk/same:1", format="dir")
        self.assertEqual(imgs.list(), [got])
        # the command line reads the same registry and prints the same record
        cli = Images(registry=self.reg)
        cli.use_lib = False
        self.assertEqual(cli.inspect("sdk/same:1"), got)
        self.assertEqual(imgs.inspect(got["manifest"]), got)
        imgs.remove("sdk/same:1")
        self.assertEqual(cli.list(), [])

    def test_registry_errors_name_it(self):
        with self.assertRaises(InvalidArgument) as cm:
            Images(registry="ftp://nowhere/layers").list()
        self.assertIn("ftp://nowhere/layers", str(cm.exception))
        with self.assertRaises(InvalidArgument) as cm:
            Images(registry=self.reg).pull("127.0.0.1:1/sdk/none:1", password="p")
        self.assertIn("username", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
