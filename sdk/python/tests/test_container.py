"""The Python SDK's container, microVM and VM sandboxes against a real embedded cell.

setUpModule builds busybox:1 into a fresh layer registry (scripts/build-envs.sh --only busybox),
starts `dsec up --config` with one node (backend native, types [function, container, microvm,
vm]; the VM types under QEMU, TCG without /dev/kvm) on a free port, and
tears everything down afterwards, checking that no sandbox mount is left behind. Needs root
(mounts, cgroups, crun); skipped otherwise. Environment as test_sdk.py: DSEC_BIN, DSEC_LIB.
"""
import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import uuid

import embedded
from dsec import (AsyncDSecClient, AsyncDirWatch, AsyncProcess, AsyncSandbox, CommandFailed,
                  ContainerArgs, DSecClient, DSecError, FunctionArgs, InvalidArgument, MicroVMArgs,
                  NotFound, NotSupported, StateError, VMArgs)

from embedded import ROOT
ENV = "busybox:1"
SMALL = dict(cpu=0.25, memory_mb=64, max_lifetime_s=600)

_cell = {}


def _mounts_under(prefix):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def setUpModule():
    if os.geteuid() != 0:
        raise unittest.SkipTest("container sandboxes need root (mounts, cgroups, crun): "
                                "run the test as root to exercise them")
    binary = embedded.binary()
    tmp = tempfile.mkdtemp(prefix="dsec-sdkct-")
    _cell["tmp"] = tmp
    _cell["binary"] = binary
    # unique per run: the node's cgroups (dsec-ct-<node>) live on the host, not under tmp
    node = "sdkct%d-0" % os.getpid()
    _cell["node"] = node
    build = subprocess.run([os.path.join(ROOT, "scripts", "build-envs.sh"), "--dsec", binary,
                            "--registry", os.path.join(tmp, "layers"), "--state-dir", tmp,
                            "--only", "busybox"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
    if build.returncode != 0:
        tearDownModule()
        raise RuntimeError("building %s failed:\n%s" % (ENV, build.stdout))
    conf = os.path.join(tmp, "cell.yaml")
    with open(conf, "w") as f:
        f.write("cell: sdkct\n"
                "layers: {path: %s}\n"
                "reports: {capacity_ms: 20, full_ms: 500, heartbeat_ms: 100, reap_ms: 200}\n"
                # network containment with a pypi mirror (tag 201: its own table and pool)
                "net: {enabled: true, tag_base: 201, masquerade: false, upstream: [\"127.0.0.1:9\"],\n"
                "      mirrors: {pypi: [\"pypi.test:443/tcp\"]}}\n"
                "nodes:\n"
                "  - name: %s\n"
                "    cpu_milli: 8000\n"
                "    memory_mb: 16384\n"
                "    slots: 64\n"
                "    types: [function, container, microvm, vm]\n"
                "    backend: native\n"
                # its own uid range (test_function: 1.7e9, test_function_bus: 1.6e9)
                "    options: {function.uid_base: \"1800000000\", function.max_workers: \"16\",\n"
                "              function.pool_python3: \"2\", function.pool_sh: \"1\",\n"
                "              function.pool_native: \"0\"}\n" % (os.path.join(tmp, "layers"), node))
    start_cell(binary, conf, tmp)


def start_cell(binary, conf, tmp):
    """`dsec up --config conf` on a free port, state under tmp, into _cell; torn down and
    raised when it does not start."""
    embedded.start(_cell, binary, tmp, conf=conf, teardown=tearDownModule)


def tearDownModule():
    tmp = _cell.get("tmp")
    state = os.path.join(tmp, "state") if tmp else None
    node_dir = os.path.join(state, "node-" + _cell.get("node", ""), "container") if state else None
    # Containers outlive their node manager (it re-adopts them on restart), so every
    # sandbox must be stopped by the tests; what is still mounted now was leaked.
    leaked = _mounts_under(os.path.join(node_dir, "sb") + "/") if node_dir else []
    embedded.stop(_cell, timeout=20)
    if node_dir and os.path.isdir(os.path.join(node_dir, "run")):
        run = os.path.join(node_dir, "run")
        ids = subprocess.run(["crun", "--root", run, "list", "-q"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True).stdout.split()
        for cid in ids:
            subprocess.run(["crun", "--root", run, "delete", "-f", cid],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # VMs outlive their node manager too: a QEMU still running under tmp was leaked
    qemus = subprocess.run(["pgrep", "-f", "qemu-system.*%s/" % tmp], stdout=subprocess.PIPE,
                           text=True).stdout.split() if tmp else []
    for pid in qemus:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    if qemus:
        leaked.append("QEMU processes %s" % qemus)
    if tmp:
        for m in sorted(_mounts_under(tmp + "/"), reverse=True):
            subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)
    if _cell.get("node"):
        for base in ("/sys/fs/cgroup",) + tuple(
                os.path.join("/sys/fs/cgroup", d) for d in os.listdir("/sys/fs/cgroup")):
            try:
                os.rmdir(os.path.join(base, "dsec-ct-" + _cell["node"]))
            except OSError:
                pass
    if leaked:
        raise AssertionError("sandbox mounts left after the tests stopped their sandboxes: %s"
                             % leaked)


class Base(unittest.TestCase):
    def setUp(self):
        self.c = DSecClient(url=_cell["url"], timeout_ms=30000)
        self.addCleanup(self.c.close)

    def make(self, **kw):
        """A busybox:1 container, stopped when the test ends."""
        args = dict(SMALL, environment=ENV)
        args.update(kw)
        sb = self.c.run_container(ContainerArgs(**args))
        self.addCleanup(self.stop_quietly, sb)
        return sb

    @staticmethod
    def stop_quietly(sb):
        try:
            sb.stop()
        except NotFound:
            pass

    def sh(self, sb, line):
        r = sb.run_shell(line, timeout_ms=20000)
        self.assertEqual(r.exit_code, 0, "%r in %s: %s" % (line, sb.id, r.stderr))
        return r.text.rstrip("\n")


class TestContainer(Base):
    def test_create_and_run_shell(self):
        sb = self.make(cpu=0.5, memory_mb=64, max_lifetime_s=600, idle_timeout_s=300,
                       labels={"suite": "sdk", "case": "create"},
                       rollout_id="sdkct-" + uuid.uuid4().hex[:8],
                       network={"pypi": True, "npm": False})
        self.assertEqual(sb.type, "container")
        self.assertTrue(sb.id.startswith(_cell["node"] + "-"), sb.id)
        st = sb.status()
        self.assertEqual((st.type, st.state), ("container", "running"))
        r = sb.run_shell("echo hello from $(hostname); echo oops >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (3, b"hello from %s\n" % sb.id.encode(),
                                                             b"oops\n"))
        self.assertFalse(r.ok)
        self.assertEqual(sb.exec(["cat"], stdin=b"in\x00put").stdout, b"in\x00put")
        self.assertEqual(sb.exec(["sh", "-c", "echo $A:$PWD"], env={"A": "1"}, cwd="/tmp").text,
                         "1:/tmp\n")
        self.assertEqual(sb.exec(["id", "-u"], user="nobody", cwd="/tmp").text, "65534\n")
        # no command: the environment's default one, which busybox:1 (not an image) lacks
        with self.assertRaises(InvalidArgument) as cm:
            sb.exec()
        self.assertIn("no default command", str(cm.exception))
        with self.assertRaises(CommandFailed) as cm:
            sb.exec(["false"], check=True)
        self.assertEqual(cm.exception.result.exit_code, 1)
        r = sb.run_shell("sleep 5", timeout_ms=300)
        self.assertTrue(r.timed_out)
        # network rules are enforced by the node's containment: the container has its own
        # namespace with loopback and one veth to the node (docs/network.md)
        ifaces = [l.split(":")[0].strip() for l in self.sh(sb, "cat /proc/net/dev").splitlines()[2:]]
        self.assertEqual(sorted(ifaces), ["eth0", "lo"])

    def test_request_id_is_idempotent(self):
        rid = uuid.uuid4().hex
        a = self.make(request_id=rid)
        b = self.c.run_container(ContainerArgs(environment=ENV, request_id=rid, **SMALL))
        self.assertEqual((b.id, b.info.existing), (a.id, True))  # a retried create: no second one
        self.assertFalse(a.info.existing)

    def test_memory_limit(self):
        sb = self.make(memory_mb=32)
        # busybox tail holds a newline-free input whole: 5 MB fits in 32 MB, 60 MB does not
        # and tail is SIGKILLed by the cgroup's OOM killer (exit 128 + 9)
        line = "head -c %d /dev/zero | tail > /dev/null; echo $?"
        self.assertEqual(self.sh(sb, line % 5000000), "0")
        r = sb.run_shell(line % 60000000, timeout_ms=20000)
        # the OOM killer may take the shell too: then the exec itself ends by SIGKILL
        self.assertTrue(r.stdout == b"137\n" or r.signal == 9, r)
        self.assertEqual(self.sh(sb, "echo alive"), "alive")

    def test_lifetime_and_idle_timeout(self):
        short = self.make(max_lifetime_s=2)
        idle = self.make(max_lifetime_s=600, idle_timeout_s=2)
        keep = self.make(max_lifetime_s=600, idle_timeout_s=600)
        for sb in (short, idle):
            sb.wait_state("gone", 10000)
            with self.assertRaises(NotFound):
                sb.run_shell("true")
        self.assertEqual(keep.status().state, "running")

    def test_files_round_trip(self):
        sb = self.make()
        blob = bytes(range(256)) * 1000
        sb.files.write("/work/blob.bin", blob)
        self.assertEqual(sb.files.read("/work/blob.bin"), blob)
        sb.files.write("/work/log.txt", "one\n")
        sb.files.write("/work/log.txt", "two\n", append=True)
        self.assertEqual(sb.files.read("/work/log.txt"), b"one\ntwo\n")
        sb.files.write("/work/run.sh", "#!/bin/sh\necho ran $1\n", mode=0o755)
        self.assertEqual(self.sh(sb, "/work/run.sh x; cat /work/log.txt | wc -l"), "ran x\n2")
        self.sh(sb, "mkdir /work/sub && printf made > /work/sub/f")
        self.assertEqual(sb.files.read("/work/sub/f"), b"made")
        ents = {e.name: e for e in sb.files.list("/work")}
        self.assertEqual(set(ents), {"blob.bin", "log.txt", "run.sh", "sub"})
        self.assertEqual((ents["blob.bin"].kind, ents["blob.bin"].size), ("file", len(blob)))
        self.assertEqual(ents["sub"].kind, "dir")
        self.assertEqual(ents["run.sh"].mode & 0o777, 0o755)
        with self.assertRaises(NotFound) as cm:
            sb.files.read("/work/missing.txt")
        self.assertIn("/work/missing.txt", str(cm.exception))
        self.assertEqual((cm.exception.code, cm.exception.retry_safe), ("not_found", False))

    def test_fork(self):
        sb = self.make()
        sb.files.write("/work/state.txt", "branch point\n")
        kids = sb.fork(2)
        for k in kids:
            self.addCleanup(self.stop_quietly, k)
        self.assertEqual(len({k.id for k in kids} | {sb.id}), 3)
        self.assertEqual([k.type for k in kids], ["container", "container"])
        sb.files.write("/work/state.txt", "later\n")            # after the branch point
        for k in kids:
            self.assertEqual(k.files.read("/work/state.txt"), b"branch point\n")
            self.assertEqual(k.status().state, "running")
        kids[0].files.write("/work/kid0.txt", "mine")
        with self.assertRaises(NotFound):
            kids[1].files.read("/work/kid0.txt")
        with self.assertRaises(NotFound):
            sb.files.read("/work/kid0.txt")
        self.assertEqual(self.sh(sb, "cat /work/state.txt"), "later")
        # a child forks again and stops independently of its parent
        grandkid, = kids[0].fork(1)
        self.addCleanup(self.stop_quietly, grandkid)
        kids[0].stop()
        self.assertEqual(grandkid.files.read("/work/kid0.txt"), b"mine")
        with self.assertRaises(InvalidArgument):
            sb.fork(0)

    def test_snapshot_then_create_from_it(self):
        sb = self.make()
        self.sh(sb, "mkdir -p /work /opt/tool && echo solved > /work/state.txt && "
                    "echo v2 > /opt/tool/VERSION")
        name = "sdkct/snap-%s:1" % uuid.uuid4().hex[:8]
        self.assertEqual(sb.snapshot(name), name)
        sb.files.write("/work/state.txt", "after the snapshot\n")   # the source keeps running
        new = self.make(environment=name)
        self.assertEqual(self.sh(new, "cat /work/state.txt /opt/tool/VERSION"), "solved\nv2")
        new.files.write("/work/state.txt", "new's own\n")
        self.assertEqual(sb.files.read("/work/state.txt"), b"after the snapshot\n")
        # a second sandbox from the same environment starts from the snapshot, not from new
        other = self.make(environment=name)
        self.assertEqual(other.files.read("/work/state.txt"), b"solved\n")

    def test_snapshot_bad_names(self):
        sb = self.make()
        for bad in ("no-version", "two:colons:1", "", None):
            with self.assertRaises(InvalidArgument) as cm:
                sb.snapshot(bad)
            self.assertEqual((cm.exception.code, cm.exception.retry_safe), ("invalid", False))
            if bad:
                self.assertIn(bad, str(cm.exception))

    def test_pause_resume(self):
        sb = self.make()
        # The ticker appends the kernel's uptime (CLOCK_BOOTTIME, which the
        # container shares with this host; 10 ms steps) every 20 ms. A value
        # inside the paused window can only have been read while the ticker ran.
        sb.processes.start(["sh", "-c", "mkdir -p /work; while true; do read up idle "
                            "< /proc/uptime; echo $up >> /work/tick; usleep 20000; done"])

        def ticks():
            try:
                return [float(x) for x in sb.files.read("/work/tick").split()]
            except NotFound:
                return []

        def uptime():
            return time.clock_gettime(time.CLOCK_BOOTTIME)

        t0 = len(ticks())
        time.sleep(0.6)
        self.assertGreater(len(ticks()) - t0, 3, "the ticker in %s does not run" % sb.id)
        sb.pause()
        frozen_from = uptime()  # pause answers once every task of the sandbox is frozen
        self.assertEqual(sb.status().state, "paused")
        with self.assertRaises(StateError) as cm:
            sb.run_shell("true")
        self.assertIn("paused", str(cm.exception))
        time.sleep(0.8)
        frozen_until = uptime()
        sb.resume()
        during = [t for t in ticks() if frozen_from + 0.02 < t < frozen_until - 0.02]
        self.assertEqual(during, [], "the ticker ran while %s was paused (%.2f..%.2f)"
                         % (sb.id, frozen_from, frozen_until))
        self.assertEqual(sb.status().state, "running")
        t2 = len(ticks())
        time.sleep(0.3)
        self.assertGreater(len(ticks()), t2, "the ticker did not continue after resume")

    def test_trajectory_fast_forward(self):
        rollout = "sdkct-" + uuid.uuid4().hex[:12]
        sb = self.make(rollout_id=rollout)
        line = "mkdir -p /work; echo step >> /work/log; wc -l < /work/log"
        first = sb.run_shell(line, step=1)
        again = DSecClient(url=_cell["url"]).sandbox(sb.id, rollout_id=rollout)
        self.assertEqual(again.run_shell(line, step=1).stdout, first.stdout)  # from the log
        self.assertEqual(self.sh(sb, "wc -l < /work/log").strip(), "1")
        again._client.close()


class TestProcesses(Base):
    """Background processes: a server left running, followed, fed and stopped."""

    def test_server_follow_stdin_kill(self):
        sb = self.make()
        srv = sb.processes.start(["sh", "-c", "i=0; while [ $i -lt 3 ]; do echo tick $i; "
                                  "i=$((i+1)); sleep 0.1; done; exec sleep 300"])
        seen = b""
        for out, _ in srv.follow():
            seen += out
            if seen.count(b"tick") == 3:
                break
        self.assertEqual(seen, b"tick 0\ntick 1\ntick 2\n")
        infos = {p.handle: p for p in sb.processes.list()}
        self.assertTrue(infos[srv.handle].running)
        self.assertIn("tick", infos[srv.handle].cmdline)
        # another client, later: the same process by its handle, its output kept
        with DSecClient(url=_cell["url"]) as c2:
            again = c2.sandbox(sb.id).processes.get(srv.handle)
            self.assertEqual(again.read().stdout, b"tick 0\ntick 1\ntick 2\n")
            again.kill()
        info = srv.wait(timeout=10)
        self.assertFalse(info.running)
        self.assertEqual((info.signal, info.exit_code), (9, -1))
        with self.assertRaises(StateError):
            srv.signal(15)
        # stdin at the reader's pace, then closed
        cat = sb.processes.start(["sh", "-c", "wc -c"], keep_stdin=True)
        cat.write(b"x" * (3 << 20))
        cat.close_stdin()
        self.assertEqual(cat.wait(timeout=30).exit_code, 0)
        self.assertEqual(cat.read().stdout.strip(), str(3 << 20).encode())
        with self.assertRaises(NotFound):
            sb.processes.get(10 ** 6).info()
        with self.assertRaises(InvalidArgument):
            sb.processes.start("echo hi")

    def test_ring_keeps_the_tail(self):
        sb = self.make()
        p = sb.processes.start(["sh", "-c", "i=0; while [ $i -lt 2000 ]; do "
                                "echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done"],
                               ring_bytes=4096)
        info = p.wait(timeout=30)
        self.assertEqual(info.exit_code, 0)
        w = p.read()
        self.assertEqual(len(w.stdout), 4096)
        self.assertEqual(w.stdout_from, info.stdout_total - 4096)
        self.assertTrue(w.stdout.endswith(b"line-1999-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n"))


class TestAsyncProcesses(Base):
    """AsyncProcess: followed with async for, fed from a task, a follow cancelled."""

    def asb(self, **kw):
        """A busybox:1 container (stopped when the test ends) as an AsyncSandbox over self.c."""
        return AsyncSandbox(self.c.aio(), self.make(**kw))

    def test_async_for_collects_output_and_exit_code(self):
        asb = self.asb()
        script = "for i in 1 2 3; do echo $i; sleep 0.3; done; echo err >&2; exit 3"

        async def main():
            p = await asb.processes.start(["sh", "-c", script])
            self.assertIsInstance(p, AsyncProcess)
            chunks = [chunk async for chunk in p]
            info = await p.wait(timeout=30)
            # a second follow of the same handle goes on where the first ended: nothing left
            rest = [chunk async for chunk in p.follow()]
            # another client, attaching after the end: what the ring holds, from its start
            with DSecClient(url=_cell["url"], timeout_ms=30000) as c2:
                late = c2.aio().sandbox(asb.id).processes.get(p.handle)
                self.assertIsInstance(late, AsyncProcess)
                again = [chunk async for chunk in late]
            return chunks, info, rest, again

        chunks, info, rest, again = asyncio.run(main())
        for chunk in chunks + again:
            self.assertIsInstance(chunk, tuple)
        self.assertEqual(b"".join(o for o, _ in chunks), b"1\n2\n3\n")
        self.assertEqual(b"".join(e for _, e in chunks), b"err\n")
        self.assertFalse(info.running)
        self.assertEqual((info.exit_code, info.signal), (3, 0))
        self.assertEqual(rest, [])
        self.assertEqual(b"".join(o for o, _ in again), b"1\n2\n3\n")
        self.assertEqual(b"".join(e for _, e in again), b"err\n")

    def test_stdin_written_from_a_task(self):
        asb = self.asb()

        async def main():
            p = await asb.processes.start(
                ["sh", "-c", "while read l; do echo got-$l; done; echo eof"], keep_stdin=True)
            seen = b""
            await p.write(b"a\n")
            async for out, _ in p:
                seen += out
                if b"got-a\n" in seen:
                    break
            writer = asyncio.ensure_future(p.write(b"b\nc\n", close=True))
            async for out, _ in p:  # goes on from where the loop above stopped
                seen += out
            await writer
            return seen, await p.wait(timeout=30)

        seen, info = asyncio.run(main())
        self.assertEqual(seen, b"got-a\ngot-b\ngot-c\neof\n")
        self.assertEqual(info.exit_code, 0)

    def test_cancelled_follow_leaves_the_process_running(self):
        asb = self.asb()

        async def main():
            p = await asb.processes.start(
                ["sh", "-c", "echo start; read x; echo after-$x; exec sleep 300"],
                keep_stdin=True)
            in_flight = [0]
            read = p.sync.read

            def counted(*a, **kw):  # the reads follow() runs on the pool, counted
                in_flight[0] += 1
                try:
                    return read(*a, **kw)
                finally:
                    in_flight[0] -= 1

            p.sync.read = counted
            started = asyncio.Event()
            seen = []

            async def follower():
                async for out, _ in p:
                    seen.append(out)
                    started.set()

            task = asyncio.ensure_future(follower())
            await asyncio.wait_for(started.wait(), 30)
            await asyncio.sleep(0.2)  # the follower waits in a read now, most likely
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            running = (await p.info()).running
            # the cancelled read's thread comes back: its wait is bounded
            deadline = asyncio.get_running_loop().time() + 30
            while in_flight[0] and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            threads_left = in_flight[0]
            # nothing was lost: a new follow picks up what came after the cancel
            await p.write(b"go\n")
            after = b""
            async for out, _ in p:
                after += out
                if b"\n" in after:
                    break
            await p.kill()
            info = await p.wait(timeout=30)
            tail = [chunk async for chunk in p]  # ends now that it has exited
            return seen, running, threads_left, after, info, tail

        seen, running, threads_left, after, info, tail = asyncio.run(main())
        self.assertEqual(b"".join(seen), b"start\n")
        self.assertTrue(running)
        self.assertEqual(threads_left, 0)
        self.assertEqual(after, b"after-go\n")
        self.assertEqual((info.running, info.signal), (False, 9))
        self.assertEqual(tail, [])

    def test_async_pty_is_an_async_process(self):
        asb = self.asb()

        async def main():
            t = await asb.pty(["sh"])
            self.assertIsInstance(t, AsyncProcess)
            self.assertTrue((await t.info()).pty)
            await t.write(b"echo pty-$((6*7)); exit 4\n")
            out = b"".join([data async for data in t])  # bytes, until it exits
            return out, await t.wait(timeout=30)

        out, info = asyncio.run(main())
        self.assertIn(b"pty-42", out)
        self.assertEqual(info.exit_code, 4)


    def test_async_watch_and_shell(self):
        asb = self.asb()
        asb.sync.run_shell("mkdir -p /w", check=True)

        async def main():
            seen = []
            async with await asb.files.watch("/w", recursive=True) as w:
                self.assertIsInstance(w, AsyncDirWatch)
                await asb.run_shell("mkdir /w/d && echo 1 > /w/x && rm /w/x", check=True)
                async for ev in w:
                    seen.append((ev.event, ev.path, ev.dir))
                    if ev.event == "delete":
                        break
            async with await asb.shell() as sh:
                await sh.run("cd /w")
                pwd = (await sh.run("pwd")).stdout
                session = (await sh.info()).session
            return seen, pwd, session

        seen, pwd, session = asyncio.run(main())
        self.assertEqual(seen, [("create", "/w/d", True), ("create", "/w/x", False),
                                ("modify", "/w/x", False), ("delete", "/w/x", False)])
        self.assertEqual(pwd, b"/w\n")
        self.assertTrue(session)


class TestShellAndPty(Base):
    """Shell sessions keep state across commands; terminals echo, resize and take Ctrl-C."""

    def test_shell_keeps_state_and_interrupts_one_command(self):
        sb = self.make()
        with sb.shell() as sh:
            self.assertTrue(sh.run("cd /tmp && export A=1 && B=2").ok)
            r = sh.run("echo $(pwd) $A $B; echo e >&2; exit_code_test() { return 3; }; "
                       "exit_code_test")
            self.assertEqual((r.exit_code, r.stdout, r.stderr), (3, b"/tmp 1 2\n", b"e\n"))
            r = sh.run("sleep 100", timeout_s=1)
            self.assertTrue(r.timed_out)
            self.assertFalse(r.ok)
            import threading
            t = threading.Timer(0.5, sh.interrupt)
            t.start()
            r = sh.run("sleep 100; echo never")
            t.join()
            self.assertTrue(r.interrupted)
            self.assertNotIn(b"never", r.stdout)
            self.assertEqual(sh.run("echo $A$B").stdout, b"12\n")
            with self.assertRaises(CommandFailed):
                sh.run("false", check=True)
            with self.assertRaises(InvalidArgument):
                sh.run("")
            r = sh.run("exit 9")
            self.assertEqual((r.exit_code, r.session_ended), (9, True))
            with self.assertRaises(StateError):
                sh.run("true")

    def test_pty_echo_resize_ctrl_c(self):
        sb = self.make()
        t = sb.pty(["sh"], rows=25, cols=90)
        self.assertTrue(t.info().pty)

        def until(want):
            seen = b""
            for _ in range(60):
                seen += t.recv(0.5)
                if want in seen:
                    return seen
            self.fail("the terminal never showed %r: %r" % (want, seen))

        t.write(b"stty size\n")
        until(b"25 90")
        t.resize(33, 111)
        t.write(b"stty size\n")
        until(b"33 111")
        t.write(b"sleep 100\n")
        import time
        time.sleep(0.3)
        t.interrupt()
        t.write(b"echo ok-$((2+3))\n")
        until(b"ok-5")
        t.write(b"exit 6\n")
        rest = b"".join(t)  # iteration ends when it has exited and all is read
        self.assertIsInstance(rest, bytes)
        self.assertEqual(t.wait(timeout=10).exit_code, 6)
        with self.assertRaises(InvalidArgument):
            t.resize(0, 10)

    def test_watch_a_directory(self):
        sb = self.make()
        sb.run_shell("mkdir -p /w", check=True)
        with sb.files.watch("/w", recursive=True) as w:
            sb.run_shell("mkdir /w/d && echo 1 > /w/x && rm /w/x", check=True)
            seen = []
            for ev in w:
                seen.append((ev.event, ev.path, ev.dir))
                if ev.event == "delete":
                    break
        self.assertEqual(seen, [("create", "/w/d", True), ("create", "/w/x", False),
                                ("modify", "/w/x", False), ("delete", "/w/x", False)])
        with self.assertRaises(NotFound):
            sb.files.watch("/missing")


class TestFunction(Base):
    """Function calls, the lightest type, through the same SDK calls as the other types."""

    def fn(self, runtime="python3", **kw):
        args = dict(memory_mb=128, max_lifetime_s=600, labels={"runtime": runtime})
        args.update(kw)
        sb = self.c.run_function(FunctionArgs(**args))
        self.addCleanup(self.stop_quietly, sb)
        return sb

    def test_python_calls(self):
        sb = self.fn()
        self.assertEqual((sb.type, sb.status().state), ("function", "running"))
        self.assertEqual(sb.exec(["python3", "-c", "print(6 * 7)"]).stdout, b"42\n")
        sb.files.write("/work/solve.py", "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n")
        self.assertEqual(sb.files.read("/work/solve.py")[:10], b"import sys")
        self.assertEqual(sb.exec(["python3", "solve.py"], stdin="1 2 3").stdout, b"6\n")
        r = sb.exec(["python3", "--call", "add", "-c", "def add(a, b): return a + b", "2", "3"])
        self.assertEqual((r.exit_code, r.stdout), (0, b"5\n"))
        r = sb.exec(["python3", "-c", "import sys; print('e', file=sys.stderr); sys.exit(3)"])
        self.assertEqual((r.exit_code, r.stderr), (3, b"e\n"))
        # nothing carries over from one call to the next: not /tmp, not a file a call wrote
        # under /work; the sandbox's own files are there for every call
        w = "open('/tmp/x', 'w').write('1'); open('/work/y', 'w').write('2')"
        self.assertEqual(sb.exec(["python3", "-c", w]).exit_code, 0)
        r = sb.exec(["python3", "-c", "import os; print([os.path.exists(p) for p in "
                     "('/tmp/x', '/work/y', '/work/solve.py')])"])
        self.assertEqual(r.stdout, b"[False, False, True]\n")
        r = sb.exec(["python3", "-c", "print('x' * 100)"], output_max=8)
        self.assertEqual((r.stdout, r.stdout_truncated), (b"x" * 8, True))
        r = sb.exec(["python3", "-c", "while True: pass"], timeout_ms=300)
        self.assertTrue(r.timed_out, r)
        self.assertEqual(sb.exec(["python3", "-c", "print(1)"]).stdout, b"1\n")

    def test_sh_runtime(self):
        sb = self.fn(runtime="sh")
        self.assertEqual(sb.run_shell("echo $((6 * 7))").stdout, b"42\n")

    def test_sh_in_an_environment(self):
        # the call's root is busybox:1 (an EROFS layer from the node's cache), not the host's
        sb = self.fn(runtime="sh", environment=ENV)
        r = sb.run_shell("test -e /usr/bin/python3; echo $? $(readlink /bin/sh) $PATH")
        self.assertEqual(r.stdout, b"1 /bin/busybox /bin:/sbin:/usr/bin:/usr/sbin\n")
        sb.files.write("/work/in.txt", "b\na\n")
        self.assertEqual(sb.exec(["sort", "in.txt"]).stdout, b"a\nb\n")

    def test_cli_call_in_an_environment(self):
        # dsec call: a one-shot function sandbox in busybox:1, its output capped at 6 bytes
        p = subprocess.run([_cell["binary"], "call", "--runtime", "sh", "--environment", ENV,
                            "--output-max", "6", "--", "sh", "-c",
                            "test -e /usr/bin/python3; echo $? $(readlink /bin/sh)"],
                           env=dict(os.environ, DSEC_URL=_cell["url"]), capture_output=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, b"1 /bin")
        self.assertIn(b"stdout was truncated", p.stderr)

    def test_what_a_function_cannot_do(self):
        sb = self.fn()
        for op in (lambda: sb.fork(1), sb.pause, lambda: sb.snapshot("sdkct/fn:1")):
            with self.assertRaises(NotSupported) as cm:
                op()
            self.assertEqual((cm.exception.code, cm.exception.retry_safe), ("unsupported", False))
        # python3 needs its standard library, which busybox:1 lacks: the create says so
        with self.assertRaises(DSecError) as cm:
            self.c.run_function(FunctionArgs(environment=ENV, memory_mb=64))
        self.assertIn("standard library", str(cm.exception))
        self.assertIn("runtime sh or native for an environment's own programs", str(cm.exception))
        # network rules are no longer one of them: on this cell's contained nodes a function
        # sandbox with rules gets a network of its own (an eth0 beside lo); without, only lo
        names = ["python3", "-c", "import socket; print(sorted(n for _, n in socket.if_nameindex()))"]
        nsb = self.c.run_function(FunctionArgs(network={"pypi": True}, memory_mb=64))
        try:
            self.assertEqual(nsb.exec(names).stdout, b"['eth0', 'lo']\n")
        finally:
            nsb.stop()
        self.assertEqual(sb.exec(names).stdout, b"['lo']\n")
        with self.assertRaises(InvalidArgument) as cm:
            self.c.run_function(FunctionArgs(memory_mb=64, labels={"runtime": "cobol"}))
        self.assertIn("cobol", str(cm.exception))

    def test_concurrent_calls_from_one_loop(self):
        async def main():
            async with AsyncDSecClient(url=_cell["url"], timeout_ms=30000) as a:
                sb = await a.run_function(memory_mb=128, labels={"runtime": "python3"})
                try:
                    rs = await asyncio.gather(*(sb.exec(["python3", "-c", "print(%d * 2)" % i])
                                                for i in range(20)))
                finally:
                    await sb.stop()
                return [r.stdout for r in rs]

        self.assertEqual(asyncio.run(main()), [b"%d\n" % (2 * i) for i in range(20)])


class TestErrors(Base):
    def test_unknown_environment(self):
        with self.assertRaises(NotFound) as cm:
            self.c.run_container(environment="nope/missing:7", **SMALL)
        e = cm.exception
        self.assertIn("nope/missing:7", str(e))
        self.assertEqual((e.code, e.retry_safe, e.op), ("not_found", False, "create"))

    def test_unknown_environment_async(self):
        async def main():
            async with AsyncDSecClient(url=_cell["url"], timeout_ms=30000) as a:
                await a.run_container(ContainerArgs(environment="nope:2", **SMALL))
        with self.assertRaises(NotFound) as cm:
            asyncio.run(main())
        self.assertIn("nope:2", str(cm.exception))

    def test_no_environment(self):
        with self.assertRaises(InvalidArgument) as cm:
            self.c.run_container(**SMALL)
        self.assertIn("environment", str(cm.exception))

    def test_bad_network_rules(self):
        for net, what in (({"pypi": "yes"}, "pypi"), ({"": True}, "''"), (["pypi"], "list")):
            with self.assertRaises(InvalidArgument) as cm:
                self.c.run_container(environment=ENV, network=net, **SMALL)
            self.assertIn(what, str(cm.exception))

    def test_set_network(self):
        """The policy changes while the sandbox runs; bad rules name themselves."""
        sb = self.make(network={"pypi": True})
        sb.set_network({"198.51.100.0/24:443/tcp": True, "pypi": False})
        sb.set_network({})
        with self.assertRaises(InvalidArgument) as cm:
            sb.set_network({"10.0.0.0/33": True})
        self.assertIn("10.0.0.0/33", str(cm.exception))
        with self.assertRaises(InvalidArgument) as cm:
            sb.set_network({"npm": True})
        self.assertIn("npm", str(cm.exception))
        with self.assertRaises(InvalidArgument):
            sb.set_network(["pypi"])
        # the sandbox has its own interface and the node's resolver, nothing else
        self.assertIn("eth0", self.sh(sb, "ip -o link show"))
        self.assertTrue(self.sh(sb, "cat /etc/resolv.conf").startswith("nameserver 100."))

    def test_stopped_container(self):
        sb = self.c.run_container(environment=ENV, **SMALL)
        sb.stop()
        for op in (lambda: sb.run_shell("true"), lambda: sb.files.read("/etc/passwd"),
                   lambda: sb.files.write("/work/x", "y"), lambda: sb.files.list("/"),
                   lambda: sb.fork(1), sb.pause, sb.resume, lambda: sb.snapshot("sdkct/x:1"),
                   sb.stop):
            with self.assertRaises(NotFound) as cm:
                op()
            self.assertFalse(cm.exception.retry_safe)


class TestAsync(Base):
    def test_10_concurrent_creates(self):
        async def main():
            async with AsyncDSecClient(url=_cell["url"], timeout_ms=30000) as a:
                t0 = time.monotonic()
                sbs = await asyncio.gather(*(
                    a.run_container(ContainerArgs(environment=ENV, labels={"i": str(i)}, **SMALL))
                    for i in range(10)))
                created = time.monotonic() - t0
                try:
                    self.assertEqual(len({s.id for s in sbs}), 10)
                    self.assertEqual({s.info.type for s in sbs}, {"container"})
                    await asyncio.gather(*(s.files.write("/work/i", str(i))
                                           for i, s in enumerate(sbs)))
                    outs = await asyncio.gather(*(s.run_shell("cat /work/i") for s in sbs))
                    self.assertEqual([o.stdout for o in outs], [str(i).encode() for i in range(10)])
                    kids = await sbs[0].fork(2)
                    sbs.extend(kids)
                    self.assertEqual(await kids[1].files.read("/work/i"), b"0")
                    name = "sdkct/async-%s:1" % uuid.uuid4().hex[:8]
                    self.assertEqual(await sbs[3].snapshot(name), name)
                    await sbs[4].pause()
                    self.assertEqual((await sbs[4].status()).state, "paused")
                    await sbs[4].resume()
                    from_snap = await a.run_container(environment=name, **SMALL)
                    sbs.append(from_snap)
                    self.assertEqual(await from_snap.files.read("/work/i"), b"3")
                finally:
                    await asyncio.gather(*(s.stop() for s in sbs), return_exceptions=True)
                return created

        created = asyncio.run(main())
        self.assertLess(created, 20)


class TestMicroVM(Base):
    """Switching to a microVM or a VM is a change of one parameter."""

    def vm(self, cls=MicroVMArgs, **kw):
        args = dict(environment=ENV, cpu=1, memory_mb=256, disk_mb=256, max_lifetime_s=900)
        args.update(kw)
        c = DSecClient(url=_cell["url"], timeout_ms=180000)
        self.addCleanup(c.close)
        sb = c.run_microvm(cls(**args)) if cls is MicroVMArgs else c.run_vm(cls(**args))
        self.addCleanup(self.stop_quietly, sb)
        return sb

    def test_microvm_exec_files_fork(self):
        sb = self.vm()
        self.assertEqual(sb.type, "microvm")
        host = os.uname().release
        self.assertNotEqual(self.sh(sb, "uname -r"), host)          # its own kernel
        sb.files.write("/work/state.txt", "branch point\n")
        self.assertEqual(sb.files.read("/work/state.txt"), b"branch point\n")
        self.assertIn("state.txt", [e.name for e in sb.files.list("/work")])
        kid, = sb.fork(1)
        self.addCleanup(self.stop_quietly, kid)
        self.assertEqual(kid.type, "microvm")
        sb.files.write("/work/state.txt", "later\n")
        self.assertEqual(kid.files.read("/work/state.txt"), b"branch point\n")
        self.assertNotEqual(self.sh(kid, "hostname"), self.sh(sb, "hostname"))
        r = sb.run_shell("exit 7")
        self.assertEqual(r.exit_code, 7)

    def test_vm_runs_a_command(self):
        sb = self.vm(cls=VMArgs)
        self.assertEqual(sb.type, "vm")
        self.assertEqual(self.sh(sb, "echo whole machine"), "whole machine")

    def test_microvm_too_little_memory(self):
        with self.assertRaises(InvalidArgument) as cm:
            self.c.run_microvm(MicroVMArgs(environment=ENV, memory_mb=16))
        self.assertIn("memory", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
