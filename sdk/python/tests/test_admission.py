"""The SDK and the scheduler's admission bound: "overloaded" surfaces as
dsec.Overloaded with retry_after_ms, and (libdsec's retries on) a create shed
once is placed on its retry, once.

A cell of its own (`dsec up --config`): one scheduler replica that holds one
create (scheduler.admit_max: 1), one sim node of 3000 milli-CPU.
Run from sdk/python: python3 -m unittest discover -s tests -p test_admission.py -v
"""
import os
import shutil
import tempfile
import threading
import time
import unittest

import dsec
import embedded
from dsec import DSecClient

CONFIG = """cell: sdkadmit
scheduler:
  admit_max: 1
  park_max: 1
nodes:
  - name: sdkadmit-0
    cpu_milli: 3000
    memory_mb: 4096
    slots: 16
    types: [sim]
    backend: sim
    sim: {time_scale: 0}
"""

_cell = {}


def setUpModule():
    binary = embedded.binary()
    tmp = tempfile.mkdtemp(prefix="dsec-sdk-admit-")
    _cell["tmp"] = tmp
    cfg = os.path.join(tmp, "cell.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    embedded.start(_cell, binary, tmp, conf=cfg, teardown=tearDownModule)


def tearDownModule():
    embedded.stop(_cell)
    if _cell.get("tmp"):
        shutil.rmtree(_cell["tmp"], ignore_errors=True)


class TestOverloaded(unittest.TestCase):
    def test_shed_then_placed(self):
        with DSecClient(url=_cell["url"], timeout_ms=15000) as c, \
                DSecClient(url=_cell["url"], timeout_ms=5000, retries=0) as once:
            # the node known to the scheduler, then a job that takes 1000 of its 3000
            a = None
            for _ in range(100):
                try:
                    a = c.run("sim", cpu=1.0, memory_mb=16, cls="job")
                    break
                except dsec.DSecError:
                    time.sleep(0.05)
            self.assertIsNotNone(a)
            time.sleep(0.5)  # a node report confirms it: the replica holds nothing
            # a rollout that does not fit (2500 > 2000 free) parks: the replica holds 1
            parked = {}

            def park():
                try:
                    parked["sb"] = c.run("sim", cpu=2.5, memory_mb=16, cls="rollout")
                except dsec.DSecError as e:
                    parked["err"] = e

            t = threading.Thread(target=park)
            t.start()
            time.sleep(0.5)
            # without retries the caller sees the scheduler's answer as it is
            with self.assertRaises(dsec.Overloaded) as cm:
                once.run("sim", cpu=0.5, memory_mb=16, cls="job")
            e = cm.exception
            self.assertEqual((e.code, e.retry_safe), ("overloaded", True))
            self.assertGreater(e.retry_after_ms, 0)
            # with retries (the default) the same kind of create waits its turn:
            # room comes (a goes, the rollout is placed), then it is placed, once
            got = {}

            def retried():
                try:
                    got["sb"] = c.run("sim", cpu=0.5, memory_mb=16, cls="job")
                except dsec.DSecError as e:
                    got["err"] = e

            r = threading.Thread(target=retried)
            r.start()
            time.sleep(0.3)
            self.assertTrue(r.is_alive())  # shed, and being retried rather than failed
            a.stop()
            r.join(20)
            t.join(20)
            self.assertNotIn("err", parked, parked.get("err"))
            self.assertNotIn("err", got, got.get("err"))
            self.assertIn("sb", got)
            got["sb"].stop()
            parked["sb"].stop()


if __name__ == "__main__":
    unittest.main()
