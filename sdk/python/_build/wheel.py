"""wheel.py - a PEP 517 build backend for the dsec SDK: the package is pure Python, so a
wheel is a zip of dsec/ with its metadata. In-tree and without requirements, so
`pip install ./sdk/python` works where no package index can be reached."""
import base64
import hashlib
import os
import zipfile

NAME, VERSION = "dsec", "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST = "%s-%s.dist-info" % (NAME, VERSION)
TAG = "py3-none-any"

METADATA = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
            "Summary: Python SDK of the dsec sandbox platform (ctypes over libdsec.so)\n"
            "Requires-Python: >=3.9\n" % (NAME, VERSION))
WHEEL = "Wheel-Version: 1.0\nGenerator: dsec _build/wheel.py\nRoot-Is-Purelib: true\nTag: %s\n" % TAG


def _files():
    pkg = os.path.join(HERE, NAME)
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                full = os.path.join(root, f)
                yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(METADATA)
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(WHEEL)
    return DIST


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "%s-%s-%s.whl" % (NAME, VERSION, TAG)
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for full, arc in _files():
            with open(full, "rb") as f:
                data = f.read()
            z.writestr(arc, data)
            records.append(_record_line(arc, data))
        for fname, text in (("METADATA", METADATA), ("WHEEL", WHEEL)):
            arc = "%s/%s" % (DIST, fname)
            z.writestr(arc, text)
            records.append(_record_line(arc, text.encode()))
        records.append("%s/RECORD,," % DIST)
        z.writestr("%s/RECORD" % DIST, "\n".join(records) + "\n")
    return name


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    base = "%s-%s" % (NAME, VERSION)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "_build/wheel.py"]:
            t.add(os.path.join(HERE, rel), arcname="%s/%s" % (base, rel))
        for full, arc in _files():
            t.add(full, arcname="%s/%s" % (base, arc))
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        data = METADATA.encode()
        info.size = len(data)
        import io
        t.addfile(info, io.BytesIO(data))
    return name
