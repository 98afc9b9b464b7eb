"""The Python side of make bench S=sdk: asynchronous creates from one Python
process (one event loop, dsec.AsyncDSecClient) with WINDOW creates in flight,
then destroys (not timed). Prints
"creates_per_s=<x> cpu_us_per_create=<y> ok=<n> failed=<n>", where the CPU is
the whole process's (every thread, libdsec's included) over the timed creates.

Two shapes of trainer code, the same window in flight:
  workers  WINDOW tasks, each awaiting one create after another (a trainer's
           WINDOW concurrent rollout loops);
  tasks    one task per create, all started at once with asyncio.gather and
           held to WINDOW in flight by an asyncio.Semaphore. This adds
           asyncio's own cost of N tasks and of a semaphore wait per create
           to the SDK's.

usage: python3 bench/sdk.py URL N WINDOW [workers|tasks]
       (PYTHONPATH=sdk/python, DSEC_LIB=...)"""
import asyncio
import sys
import time

import dsec


async def main(url, n, window, shape):
    client = dsec.DSecClient(url=url, name="bench-sdk-py")
    a = client.aio()
    args = dsec.SandboxArgs(cpu=0.001, memory_mb=1, max_lifetime_s=600)
    ok, errs = [], []

    async def create():
        try:
            ok.append(await a.run("sim", args))
        except dsec.DSecError as e:
            errs.append(e)

    left = n

    async def worker():
        nonlocal left
        while left > 0:
            left -= 1
            await create()

    sem = asyncio.Semaphore(window)

    async def one():
        async with sem:
            await create()

    t0, c0 = time.monotonic(), time.process_time()
    if shape == "workers":
        await asyncio.gather(*(worker() for _ in range(min(window, n))))
    else:
        await asyncio.gather(*(one() for _ in range(n)))
    dt, cpu = time.monotonic() - t0, time.process_time() - c0
    for s in ok:
        s.sync.stop()
    client.close()
    print("creates_per_s=%.1f cpu_us_per_create=%.1f ok=%d failed=%d"
          % (len(ok) / dt, cpu / n * 1e6, len(ok), n - len(ok)))
    if errs:
        print("bench sdk.py: first failure: %s" % errs[0], file=sys.stderr)
    return 0 if len(ok) == n else 1


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or (len(sys.argv) == 5 and sys.argv[4] not in ("workers", "tasks")):
        print("usage: sdk.py URL N WINDOW [workers|tasks]", file=sys.stderr)
        sys.exit(2)
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                              sys.argv[4] if len(sys.argv) == 5 else "workers")))
