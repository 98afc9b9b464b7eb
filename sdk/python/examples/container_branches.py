"""Containers: prepare a task once, branch it with fork(n), keep the best branch as an environment.

    scripts/build-envs.sh --only busybox --registry /tmp/reg --state-dir /tmp/st
    dsec up --config cell.yaml &      # a node with backend: native, types: [container],
                                      # and layers: {path: /tmp/reg} (docs/sdk.md)
    PYTHONPATH=sdk/python python3 sdk/python/examples/container_branches.py [--url URL] [--n 4]

One container is set up (the expensive part, done once), forked into n
branches that each try a different action from the same state (fork is O(1):
a snapshot of the writable layer), the best branch is published with
snapshot(name) as a new environment, and a fresh container started from that
environment carries on from it.
"""
import argparse
import asyncio
import uuid

import dsec


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None, help="default: $DSEC_URL or nats://127.0.0.1:4222")
    ap.add_argument("--env", default="busybox:1", help="environment name:version")
    ap.add_argument("--n", type=int, default=4, help="branches")
    o = ap.parse_args()
    args = dsec.ContainerArgs(environment=o.env, cpu=0.5, memory_mb=128, max_lifetime_s=600,
                              idle_timeout_s=120, labels={"example": "branches"})
    async with dsec.AsyncDSecClient(url=o.url) as c:
        async with await c.run_container(args) as base:
            await base.run_shell("mkdir -p /work && seq 1 100 > /work/data")   # the set-up
            branches = await base.fork(o.n)
            try:
                # each branch acts on the same state; its score is what it prints
                outs = await asyncio.gather(*(
                    b.run_shell("head -n %d /work/data > /work/pick && "
                                "awk '{s+=$1} END {print s}' /work/pick" % (10 * (i + 1)))
                    for i, b in enumerate(branches)))
                scores = [int(r.text) for r in outs]
                best = max(range(o.n), key=scores.__getitem__)
                name = "examples/best-%s:1" % uuid.uuid4().hex[:8]
                await branches[best].snapshot(name)
                print("scores %s: branch %d published as %s" % (scores, best, name))
            finally:
                await asyncio.gather(*(b.stop() for b in branches), return_exceptions=True)
        async with await c.run_container(args, environment=name) as nxt:
            r = await nxt.run_shell("wc -l < /work/pick")
            print("a new container on %s starts with %s lines picked" % (name, r.text.strip()))


if __name__ == "__main__":
    asyncio.run(main())
