"""The Python SDK against a real embedded cell (`dsec up` on a free port).

Environment: DSEC_BIN (the dsec binary; default build/default/tools/dsec),
DSEC_LIB (libdsec.so; default: next to the build). Run from sdk/python:
    python3 -m unittest discover -s tests -v
"""
import asyncio
import shutil
import tempfile
import time
import unittest
import uuid

import dsec
import embedded
from dsec import (AsyncDSecClient, DSecClient, Diverged, FunctionArgs, InvalidArgument, NotFound,
                  NotSupported, SandboxArgs)

SMALL = dict(cpu=0.01, memory_mb=16, max_lifetime_s=600)

_cell = {}


def setUpModule():
    binary = embedded.binary()
    tmp = tempfile.mkdtemp(prefix="dsec-sdk-")
    _cell["tmp"] = tmp
    embedded.start(_cell, binary, tmp, teardown=tearDownModule)
    # which sandbox types the cell offers: a create answered "unsupported" means not here
    _cell["types"] = {}
    with DSecClient(url=_cell["url"]) as c:
        for t in dsec.TYPES:
            try:
                sb = c.run(t, **SMALL)
            except NotSupported as e:
                _cell["types"][t] = str(e)
                continue
            _cell["types"][t] = None
            sb.stop()


def tearDownModule():
    embedded.stop(_cell)
    if _cell.get("tmp"):
        shutil.rmtree(_cell["tmp"], ignore_errors=True)


class Base(unittest.TestCase):
    def setUp(self):
        self.c = DSecClient(url=_cell["url"])
        self.addCleanup(self.c.close)


class TestTypes(Base):
    """Every sandbox type the cell offers, through the same calls."""

    def check_type(self, t):
        why = _cell["types"].get(t)
        if why is not None:
            self.skipTest("cell does not offer type %s: %s" % (t, why))
        run = {"function": self.c.run_function, "container": self.c.run_container,
               "microvm": self.c.run_microvm, "vm": self.c.run_vm}.get(t)
        sb = run(**SMALL) if run else self.c.run(t, SandboxArgs(**SMALL))
        self.assertEqual(sb.type, t)
        self.assertEqual(sb.status().state, "running")
        sb.files.write("/work/in.txt", b"payload\n")
        self.assertEqual(sb.files.read("/work/in.txt"), b"payload\n")
        self.assertIn("in.txt", [e.name for e in sb.files.list("/work")])
        try:
            r = sb.exec(["echo", "hello", "world"])
            self.assertEqual(r.exit_code, 0)
            if t == "sim":
                self.assertEqual(r.stdout, b"hello world\n")
                self.assertEqual(sb.exec(["false"]).exit_code, 1)
                with self.assertRaises(dsec.CommandFailed):
                    sb.exec(["false"], check=True)
                self.assertEqual(sb.exec(["cat"], stdin="abc").stdout, b"abc")
        except NotSupported:
            pass  # a backend without commands (the files above still worked)
        try:
            kids = sb.fork(2)
            self.assertEqual(len(kids), 2)
            self.assertEqual(kids[0].files.read("/work/in.txt"), b"payload\n")
            for k in kids:
                k.stop()
        except NotSupported:
            self.assertNotEqual(t, "sim")  # a backend that cannot fork says so
        try:
            sb.pause()
            self.assertEqual(sb.status().state, "paused")
            sb.resume()
            self.assertEqual(sb.status().state, "running")
        except NotSupported:
            self.assertNotEqual(t, "sim")
        name = "sdk/%s-snap:1" % t
        try:
            self.assertEqual(sb.snapshot(name), name)
        except NotSupported as e:  # containers only (the sim backend models it too)
            self.assertNotIn(t, ("sim", "container"))
            self.assertEqual((e.code, e.retry_safe), ("unsupported", False))
        with self.assertRaises(InvalidArgument):
            sb.snapshot("no-version")
        sb.stop()

    def test_some_type_available(self):
        self.assertTrue([t for t, why in _cell["types"].items() if why is None],
                        "the cell offers no sandbox type: %s" % _cell["types"])


for _t in dsec.TYPES:
    setattr(TestTypes, "test_type_" + _t, lambda self, t=_t: self.check_type(t))


def _any_type():
    """sim when the cell offers it (cheapest), else the first type offered."""
    if _cell["types"].get("sim", "") is None:
        return "sim"
    return next(t for t in dsec.TYPES if _cell["types"].get(t) is None)


class TestConcurrency(Base):
    def test_50_concurrent_creates(self):
        t = _any_type()

        async def main():
            a = self.c.aio()
            t0 = time.monotonic()
            sbs = await asyncio.gather(*(a.run(t, **SMALL, labels={"i": str(i)})
                                         for i in range(50)))
            created = time.monotonic() - t0
            self.assertEqual(len({s.id for s in sbs}), 50)
            await asyncio.gather(*(s.files.write("/work/i", str(i)) for i, s in enumerate(sbs)))
            got = await asyncio.gather(*(s.files.read("/work/i") for s in sbs))
            self.assertEqual(got, [str(i).encode() for i in range(50)])
            await asyncio.gather(*(s.stop() for s in sbs))
            return created

        created = asyncio.run(main())
        self.assertLess(created, 20)

    def test_300_creates_in_one_turn(self):
        # One loop turn sends all 300 in one batch; their answers come back
        # in bursts larger than the 32 a turn collects, so the rest must be
        # picked up on later turns (the queue's fd stays readable), and a
        # create cancelled after it was sent must not take another's answer.
        t = _any_type()

        async def main():
            a = self.c.aio()
            futs = [a.client.create_future(t, dsec.SandboxArgs(**SMALL)) for _ in range(300)]
            await asyncio.sleep(0)  # the batch goes out at the end of this turn
            for f in futs[:10]:
                f.cancel()
            done = await asyncio.wait_for(
                asyncio.gather(*futs[10:], return_exceptions=True), 60)
            errs = [d for d in done if isinstance(d, BaseException)]
            self.assertEqual(errs, [])
            self.assertEqual(len({info.id for info in done}), 290)
            for info in done:
                self.assertEqual(info.state, "running")
                await a.sandbox(info.id).stop()

        asyncio.run(main())

    def test_async_client_context(self):
        t = _any_type()

        async def main():
            async with AsyncDSecClient(url=_cell["url"]) as a:
                async with await a.run(t, **SMALL) as sb:
                    self.assertEqual((await sb.status()).state, "running")
                    with self.assertRaises(InvalidArgument) as cm:
                        await sb.snapshot("no-version")
                    self.assertIn("no-version", str(cm.exception))

        asyncio.run(main())

    def test_blocking_creates_from_threads(self):
        t = _any_type()
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(8) as pool:
            sbs = list(pool.map(lambda i: self.c.run(t, **SMALL), range(16)))
        self.assertEqual(len({s.id for s in sbs}), 16)
        for s in sbs:
            s.stop()


class TestBatchedCreates(Base):
    """Creates asked for during one turn of the loop go out in one
    dsec_cq_create_batch call: each must still get its own answer."""

    def test_results_match_requests(self):
        t = _any_type()
        tag = uuid.uuid4().hex[:10]
        n = 40

        async def main():
            a = self.c.aio()
            # all 40 in one turn: gather starts them together, one batch
            return await asyncio.gather(*(a.run(t, **SMALL, request_id="%s-%d" % (tag, i),
                                                labels={"i": str(i)}) for i in range(n)))

        sbs = asyncio.run(main())
        self.assertEqual(len({s.id for s in sbs}), n)
        for i, s in enumerate(sbs):
            self.addCleanup(s.sync.stop)
            self.assertFalse(s.info.existing)
            # the same request id names the same sandbox: sbs[i] answers request i
            again = self.c.run(t, **SMALL, request_id="%s-%d" % (tag, i))
            self.assertTrue(again.info.existing)
            self.assertEqual(again.id, s.id, "create %d got another request's sandbox" % i)

    def test_failures_are_per_create(self):
        t = _any_type()

        async def main():
            a = self.c.aio()
            kinds = ["ok", "bogus", "ok", "badproject", "ok", "bogus", "longid", "ok"]

            def one(kind, i):
                if kind == "bogus":  # refused by the cell
                    return a.run("bogus", **SMALL)
                if kind == "badproject":  # refused by libdsec when sending
                    return a.run(t, **SMALL, project="no such project!")
                if kind == "longid":  # refused by libdsec when sending
                    return a.run(t, **SMALL, request_id="x" * 40)
                return a.run(t, **SMALL, labels={"i": str(i)})

            res = await asyncio.gather(*(one(k, i) for i, k in enumerate(kinds)),
                                       return_exceptions=True)
            return kinds, res

        kinds, res = asyncio.run(main())
        oks = [r for k, r in zip(kinds, res) if k == "ok"]
        for r in oks:
            self.assertIsInstance(r, dsec.AsyncSandbox)
            self.addCleanup(r.sync.stop)
        self.assertEqual(len({r.id for r in oks}), 4)
        errs = [r for k, r in zip(kinds, res) if k != "ok"]
        self.assertEqual(len({id(e) for e in errs}), len(errs))  # an exception each
        for k, r in zip(kinds, res):
            if k == "bogus":
                self.assertIsInstance(r, NotSupported)
                self.assertEqual((r.code, r.retry_safe, r.op), ("unsupported", False, "create"))
                self.assertIn("bogus", str(r))
            elif k == "badproject":
                self.assertIsInstance(r, InvalidArgument)
                self.assertEqual((r.code, r.retry_safe), ("invalid", False))
                self.assertIn("no such project!", str(r))
            elif k == "longid":
                self.assertIsInstance(r, InvalidArgument)
                self.assertIn("req_id", str(r))

    def test_cancelled_before_sending_is_not_sent(self):
        t = _any_type()
        rid = "sdk-cancel-" + uuid.uuid4().hex[:10]

        async def main():
            a = self.c.aio()
            fut = self.c.create_future(t, SandboxArgs(**SMALL, request_id=rid))
            fut.cancel()  # in the same turn: before the batch goes out
            other = await a.run(t, **SMALL)  # the queue keeps working
            await other.stop()

        asyncio.run(main())
        sb = self.c.run(t, **SMALL, request_id=rid)
        self.addCleanup(sb.stop)
        self.assertFalse(sb.info.existing)  # the cancelled create never reached the cell

    def test_closed_before_sending(self):
        t = _any_type()
        c = DSecClient(url=_cell["url"])

        async def main():
            fut = c.create_future(t, SandboxArgs(**SMALL))
            c.close()  # before the turn ends
            with self.assertRaises(dsec.Closed) as cm:
                await fut
            self.assertEqual(cm.exception.code, "closed")

        asyncio.run(main())

    def test_spec_follows_changed_args(self):
        from dsec import client as client_mod
        args = SandboxArgs(**SMALL)
        s1 = client_mod._spec("sim", args)
        self.assertIs(client_mod._spec("sim", args), s1)  # the same arguments share a spec
        args.memory_mb = 32
        s2 = client_mod._spec("sim", args)
        self.assertEqual((s1.memory_mb, s2.memory_mb), (16, 32))
        self.assertEqual(client_mod._spec("function", args).type, b"function")
        args.labels["k"] = "v"  # with labels: built each time, never stale
        self.assertEqual(client_mod._spec("sim", args).labels[0], b"k=v")
        args.labels["k"] = "w"
        self.assertEqual(client_mod._spec("sim", args).labels[0], b"k=w")

    def test_two_loops_in_turn(self):
        t = _any_type()

        async def main():
            sb = await self.c.aio().run(t, **SMALL)
            await sb.stop()
            return sb.id

        first = asyncio.run(main())
        second = asyncio.run(main())  # a new loop in the same thread: its own queue
        self.assertNotEqual(first, second)


class TestErrors(Base):
    def test_unknown_type(self):
        with self.assertRaises(NotSupported) as cm:
            self.c.run("bogus", **SMALL)
        e = cm.exception
        self.assertEqual((e.code, e.code_num, e.retry_safe), ("unsupported", 12, False))
        self.assertIn("bogus", str(e))

    def test_unknown_type_async(self):
        async def main():
            with self.assertRaises(NotSupported):
                await self.c.aio().run("bogus", **SMALL)
        asyncio.run(main())

    def test_bad_id(self):
        with self.assertRaises(InvalidArgument) as cm:
            self.c.sandbox("nodash").exec(["echo"])
        self.assertEqual((cm.exception.code, cm.exception.retry_safe), ("invalid", False))
        with self.assertRaises(NotFound) as cm:
            self.c.sandbox("local-0-0123456789abcdef").exec(["echo"])
        self.assertEqual((cm.exception.code, cm.exception.retry_safe), ("not_found", False))

    def test_destroyed_sandbox(self):
        sb = self.c.run(_any_type(), **SMALL)
        sb.stop()
        ops = [lambda: sb.exec(["echo"]), lambda: sb.files.read("/work/x"),
               lambda: sb.files.write("/work/x", "y"), lambda: sb.files.list("/"),
               lambda: sb.fork(1), sb.pause, sb.resume, sb.stop]
        for op in ops:
            with self.assertRaises(NotFound) as cm:
                op()
            self.assertEqual(cm.exception.code, "not_found")
            self.assertFalse(cm.exception.retry_safe)

    def test_set_timeout(self):
        """A sandbox's end moves while it runs: later, sooner, never past the cell's max."""
        sb = self.c.run(_any_type(), **dict(SMALL, max_lifetime_s=2))
        t0 = time.time()
        end = sb.set_timeout(60)
        self.assertGreaterEqual(end, t0 + 59)
        self.assertLessEqual(end, time.time() + 61)
        self.assertEqual(asyncio.run(self._aset(sb, 120)) >= t0 + 119, True)
        time.sleep(2.5)  # past its first end
        self.assertEqual(sb.status().state, "running")
        for bad in (0, -5, 1.5, "60", True):
            with self.assertRaises(InvalidArgument):
                sb.set_timeout(bad)
        with self.assertRaises(InvalidArgument) as cm:
            sb.set_timeout(10 ** 7)  # beyond the cell's max_ttl_s (86400 by default)
        self.assertIn("max_ttl_s", str(cm.exception))
        sb.set_timeout(1)
        sb.wait_state("gone", timeout_ms=5000)
        with self.assertRaises(NotFound) as cm:
            sb.set_timeout(60)
        self.assertIn("max lifetime reached", str(cm.exception))

    async def _aset(self, sb, seconds):
        async with AsyncDSecClient(url=_cell["url"]) as ac:
            return await ac.sandbox(sb.id).set_timeout(seconds)

    def test_closed_client(self):
        c = DSecClient(url=_cell["url"])
        c.close()
        with self.assertRaises(dsec.Closed) as cm:
            c.run(_any_type(), **SMALL)
        self.assertEqual(cm.exception.code, "closed")

    def test_no_cell(self):
        with self.assertRaises(dsec.DSecError) as cm:
            DSecClient(url="nats://127.0.0.1:%d" % embedded.free_port(), timeout_ms=500)
        self.assertEqual(cm.exception.code, "connection")

    def test_exec_argv_must_be_list(self):
        sb = self.c.run(_any_type(), **SMALL)
        self.addCleanup(sb.stop)
        with self.assertRaises(InvalidArgument):
            sb.exec("echo hi")


class TestTrajectory(Base):
    def test_fast_forward_after_trainer_restart(self):
        rollout = "sdk-test-" + uuid.uuid4().hex[:12]
        sb = self.c.run(_any_type(), FunctionArgs(rollout_id=rollout, **SMALL))
        self.addCleanup(lambda: DSecClient(url=_cell["url"]).sandbox(sb.id).stop())
        for step in (1, 2, 3):
            sb.files.write("/work/log", "step %d\n" % step, append=True, step=step)
        r5 = sb.exec(["echo", "five"], step=5)
        self.assertEqual(sb.files.read("/work/log"), b"step 1\nstep 2\nstep 3\n")
        self.c.close()

        # the trainer restarts: a new client, the same sandbox and rollout id
        c2 = DSecClient(url=_cell["url"])
        self.addCleanup(c2.close)
        sb2 = c2.sandbox(sb.id, rollout_id=rollout)
        for step in (1, 2, 3):  # logged: answered from the log, nothing runs
            sb2.files.write("/work/log", "step %d\n" % step, append=True, step=step)
        self.assertEqual(sb2.files.read("/work/log"), b"step 1\nstep 2\nstep 3\n")
        self.assertEqual(sb2.exec(["echo", "five"], step=5).stdout, r5.stdout)
        sb2.files.write("/work/log", "step 4\n", append=True, step=4)  # not logged: runs live
        self.assertEqual(sb2.files.read("/work/log"), b"step 1\nstep 2\nstep 3\nstep 4\n")
        with self.assertRaises(Diverged) as cm:  # a different request at a logged step
            sb2.files.write("/work/log", "other\n", append=True, step=2)
        self.assertEqual((cm.exception.code, cm.exception.retry_safe), ("diverged", False))
        self.assertEqual(sb2.files.read("/work/log"), b"step 1\nstep 2\nstep 3\nstep 4\n")


class TestAsyncFiles(Base):
    """AsyncFiles streams: from async sources, to async sinks, page by page; a
    transfer left or cancelled gives its thread back."""

    KIB = 1 << 10

    def sandbox(self):
        if _cell["types"].get("sim", "") is not None:
            self.skipTest("the cell offers no sim sandboxes")
        sb = self.c.run("sim", cpu=0.01, memory_mb=16, disk_mb=256, max_lifetime_s=600)
        self.addCleanup(sb.stop)
        return dsec.AsyncSandbox(self.c.aio(), sb)

    @staticmethod
    def counted(files, name):
        """Count the calls of files.<name> in flight (they run on the client's pool)."""
        in_flight = [0]
        fn = getattr(files, name)

        def wrapper(*a, **kw):
            in_flight[0] += 1
            try:
                return fn(*a, **kw)
            finally:
                in_flight[0] -= 1

        setattr(files, name, wrapper)
        return in_flight

    @staticmethod
    async def settle(in_flight):
        """Wait (up to 30 s) until no counted call is in flight; how many still are."""
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while in_flight[0] and loop.time() < end:
            await asyncio.sleep(0.05)
        return in_flight[0]

    def test_async_sources_and_sinks(self):
        import hashlib
        import os
        asb = self.sandbox()
        data = os.urandom(9 * 1024 * self.KIB + 5)
        sha = hashlib.sha256(data).hexdigest()

        async def pieces():
            for i in range(0, len(data), 300 * self.KIB):
                await asyncio.sleep(0)
                yield data[i:i + 300 * self.KIB]

        class Sink:
            def __init__(self):
                self.parts = []

            async def write(self, b):
                await asyncio.sleep(0)
                self.parts.append(b)

        async def main():
            up = await asb.files.upload("/work/big", pieces(), chunk_size=1024 * self.KIB)
            pages = [p async for p in asb.files.iter_download("/work/big",
                                                                page_size=1024 * self.KIB)]
            sink = Sink()
            down = await asb.files.download("/work/big", sink, page_size=512 * self.KIB)
            whole = await asb.files.download("/work/big")
            reader = asyncio.StreamReader()
            reader.feed_data(data[:100 * self.KIB])
            reader.feed_eof()
            up2 = await asb.files.upload("/work/small", reader)
            small = await asb.files.read("/work/small")
            up3 = await asb.files.upload("/work/bytes", b"plain bytes")
            return up, pages, sink.parts, down, whole, up2, small, up3

        up, pages, parts, down, whole, up2, small, up3 = asyncio.run(main())
        self.assertEqual((up.size, up.sha256), (len(data), sha))
        self.assertGreater(len(pages), 1)
        self.assertTrue(all(len(p) <= 1024 * self.KIB for p in pages))
        self.assertEqual(b"".join(pages), data)
        self.assertEqual((down.size, down.sha256), (len(data), sha))
        self.assertGreater(len(parts), 1)
        self.assertEqual(b"".join(parts), data)
        self.assertEqual(whole, data)
        self.assertEqual(up2.size, 100 * self.KIB)
        self.assertEqual(small, data[:100 * self.KIB])
        self.assertEqual(up3.size, len(b"plain bytes"))

    def test_leaving_iter_download_stops_it(self):
        asb = self.asb_with_file(4 * 1024 * self.KIB)
        in_flight = self.counted(asb.sync.files, "download")

        async def main():
            pages = asb.files.iter_download("/work/f", page_size=64 * self.KIB)
            first = await pages.__anext__()
            await pages.aclose()  # what `break` does once the generator is collected
            left = await self.settle(in_flight)
            return first, left, await asb.files.stat("/work/f")

        first, left, st = asyncio.run(main())
        self.assertEqual(len(first), 64 * self.KIB)
        self.assertEqual(left, 0)
        self.assertEqual(st.size, 4 * 1024 * self.KIB)

    def test_cancelled_upload_stops_and_publishes_nothing(self):
        asb = self.sandbox()
        in_flight = self.counted(asb.sync.files, "upload")

        async def main():
            taken = asyncio.Event()

            async def stalls():
                yield b"x" * (64 * self.KIB)
                taken.set()
                await asyncio.Event().wait()  # never more
                yield b"y"

            task = asyncio.ensure_future(asb.files.upload("/work/never", stalls(),
                                                          chunk_size=64 * self.KIB))
            await asyncio.wait_for(taken.wait(), 30)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            return await self.settle(in_flight)

        self.assertEqual(asyncio.run(main()), 0)
        with self.assertRaises(NotFound):
            asb.sync.files.stat("/work/never")

    def asb_with_file(self, size):
        asb = self.sandbox()
        asb.sync.files.write("/work/f", b"z" * size)
        return asb


if __name__ == "__main__":
    unittest.main()
