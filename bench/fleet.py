"""bench/fleet.py - listing and removing by label through the SDK: N sim sandboxes on a cell of
two sim nodes (dsec up --config, see docs/control-plane.md "Fleet"), listed whole in pages of
1000 and 10000, by label, one page, then removed by label.

Usage: python3 bench/fleet.py NATS_URL N (DSEC_LIB names libdsec.so)
"""
import asyncio
import sys
import time

from dsec import AsyncDSecClient, DSecClient
N = int(sys.argv[2])
url = sys.argv[1]
async def make():
    async with AsyncDSecClient(url=url, tenant="bench") as c:
        for k in range(0, N, 1000):
            await asyncio.gather(*(c.run("sim", cpu=0.001, memory_mb=1, labels={"run": "exp-%d" % (i % 10)}, max_lifetime_s=3600) for i in range(k, min(N, k + 1000))))
t = time.monotonic(); asyncio.run(make()); print("created %d in %.1f s" % (N, time.monotonic() - t))
with DSecClient(url=url, tenant="bench", timeout_ms=20000) as c:
    for ps in (1000, 10000):
        t = time.monotonic(); n = sum(1 for _ in c.list(page_size=ps)); dt = time.monotonic() - t
        print("list all, pages of %d: %d in %.3f s" % (ps, n, dt))
    t = time.monotonic(); n = sum(1 for _ in c.list(label={"run": "exp-3"})); dt = time.monotonic() - t
    print("list run=exp-3: %d in %.3f s" % (n, dt))
    t = time.monotonic(); p = c.list_page(limit=1000); dt = time.monotonic() - t
    print("one page of 1000: %.3f s" % dt)
    t = time.monotonic(); d, f = c.remove(label={"run": "exp-3"}); dt = time.monotonic() - t
    print("remove run=exp-3: %d destroyed, %d failed in %.2f s" % (d, len(f), dt))
