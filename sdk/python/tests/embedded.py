"""An embedded cell for the SDK tests: `dsec up` on a free port, its state under a temporary
directory, stopped with Ctrl-C. Each test module keeps its cell in a dict of its own (`cell`
below) and adds its own checks to its tearDownModule.
"""
import os
import signal
import socket
import subprocess
import time
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def binary():
    """The dsec binary: DSEC_BIN (ctest names it: missing is a failure), else the default build
    (missing: the module is skipped)."""
    path = os.environ.get("DSEC_BIN") or os.path.join(ROOT, "build", "default", "tools", "dsec")
    if not os.access(path, os.X_OK):
        if os.environ.get("DSEC_BIN"):
            raise RuntimeError("DSEC_BIN=%s is not an executable" % path)
        raise unittest.SkipTest("no dsec binary at %s (set DSEC_BIN)" % path)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cell, binary_path, tmp, conf=None, teardown=None):
    """`dsec up [--config conf]` on a free port, state under tmp; proc, log and url go into
    cell. When it does not start in 30 s, teardown() runs (if given) and RuntimeError is raised
    with the cell's log."""
    port = free_port()
    log = open(os.path.join(tmp, "up.log"), "w+")
    argv = [binary_path, "up", "--port", str(port), "--state-dir", os.path.join(tmp, "state")]
    if conf is not None:
        argv[2:2] = ["--config", conf]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    cell.update(proc=proc, log=log, url="nats://127.0.0.1:%d" % port)
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log.name) as f:
            text = f.read()
        if "Ctrl-C stops" in text:
            return
        time.sleep(0.05)
    with open(log.name) as f:
        text = f.read()
    if teardown is not None:
        teardown()
    else:
        stop(cell)
    raise RuntimeError("dsec up did not start:\n" + text)


def stop(cell, timeout=10):
    """Ctrl-C to the cell, a kill after timeout seconds; closes its log."""
    proc = cell.get("proc")
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if cell.get("log"):
        cell["log"].close()
        cell["log"] = None
