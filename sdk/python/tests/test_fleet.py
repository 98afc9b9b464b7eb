"""The SDK's fleet handling against a real embedded cell (`dsec up`): list by label, state
and type (page by page), two tenants apart, bad input by field, remove by label, and each
tenant's event stream.
Run from sdk/python: python3 -m unittest discover -s tests -p test_fleet.py -v
"""
import shutil
import tempfile
import time
import unittest

import dsec
import embedded
from dsec import DSecClient, InvalidArgument, Sandbox

SMALL = dict(cpu=0.01, memory_mb=16, max_lifetime_s=600)
_cell = {}


def setUpModule():
    binary = embedded.binary()
    tmp = tempfile.mkdtemp(prefix="dsec-sdk-fleet-")
    _cell["tmp"] = tmp
    embedded.start(_cell, binary, tmp, teardown=tearDownModule)


def tearDownModule():
    embedded.stop(_cell)
    if _cell.get("tmp"):
        shutil.rmtree(_cell["tmp"], ignore_errors=True)


class TestFleet(unittest.TestCase):
    def test_list_remove_and_events(self):
        a = DSecClient(url=_cell["url"], tenant="sdkfleeta")
        b = DSecClient(url=_cell["url"], tenant="sdkfleetb")
        self.addCleanup(b.close)
        self.addCleanup(a.close)
        ea, eb = a.events(), b.events()
        self.addCleanup(eb.close)
        self.addCleanup(ea.close)
        run7 = [a.run("sim", labels={"run": "exp-7"}, **SMALL) for _ in range(5)]
        run8 = a.run("sim", labels={"run": "exp-8"}, **SMALL)
        other = b.run("sim", labels={"run": "exp-7"}, **SMALL)
        run8.pause()

        want7 = sorted(s.id for s in run7)
        got = [s.id for s in a.list(label={"run": "exp-7"}, page_size=2)]
        self.assertEqual(got, want7)  # every page walked once, in id order
        self.assertEqual([s.id for s in Sandbox.list(a, label={"run": "exp-7"}, limit=3)],
                         want7[:3])
        listed = list(a.list(state="paused"))
        self.assertEqual([s.id for s in listed], [run8.id])
        self.assertEqual(listed[0].labels, {"run": "exp-8"})
        self.assertEqual(listed[0].type, "sim")
        self.assertTrue(listed[0].created_ns > 0)
        self.assertEqual(sorted(s.id for s in a.list(type="sim")), sorted(want7 + [run8.id]))
        self.assertEqual([s.id for s in b.list()], [other.id])  # b sees its own only
        page = a.list_page(label={"run": "exp-7"}, limit=2)
        self.assertEqual(len(page.items), 2)
        self.assertEqual(page.next_cursor, page.items[-1].id)
        self.assertEqual(page.missing, [])

        for bad, fieldname in ((dict(label=["foo"]), "labels"), (dict(limit=0), "limit"),
                               (dict(limit=10001), "limit"), (dict(cursor="zzz"), "cursor"),
                               (dict(state="sleeping"), "state")):
            with self.assertRaises(InvalidArgument) as cm:
                a.list_page(**bad)
            self.assertIn(fieldname, str(cm.exception))

        destroyed, failed = a.remove(label={"run": "exp-7"})
        self.assertEqual((destroyed, failed), (5, {}))
        self.assertEqual(list(a.list(label={"run": "exp-7"})), [])
        self.assertEqual([s.id for s in a.list()], [run8.id])
        self.assertEqual([s.id for s in b.list()], [other.id])

        seen_a, seen_b = set(), set()
        deadline = time.monotonic() + 5
        want = {(i, "running") for i in want7} | {(i, "gone") for i in want7}
        while time.monotonic() < deadline and not want <= seen_a:
            e = ea.get(timeout=0.2)
            if e is not None:
                seen_a.add((e.id, e.state))
        self.assertTrue(want <= seen_a, want - seen_a)
        while True:
            e = eb.get(timeout=0.3)
            if e is None:
                break
            seen_b.add(e.id)
        self.assertIn(other.id, seen_b)
        self.assertFalse(seen_b & set(want7 + [run8.id]))
        self.assertFalse({i for i, _ in seen_a} & {other.id})


if __name__ == "__main__":
    unittest.main()
