"""The Python side of make bench S=sdk: asynchronous creates from one Python
process (one event loop, dsec.AsyncDSecClient) with a fixed window in flight,
then destroys (not timed). Prints "creates_per_s=<x> ok=<n> failed=<n>".

usage: python3 bench/sdk.py URL N WINDOW   (PYTHONPATH=sdk/python, DSEC_LIB=...)"""
import asyncio
import sys
import time

import dsec


async def main(url, n, window):
    client = dsec.DSecClient(url=url, name="bench-sdk-py")
    a = client.aio()
    args = dsec.SandboxArgs(cpu=0.001, memory_mb=1, max_lifetime_s=600)
    sem = asyncio.Semaphore(window)
    first_err = []

    async def one():
        async with sem:
            try:
                return await a.run("sim", args)
            except dsec.DSecError as e:
                first_err.append(e)
                return None

    t0 = time.monotonic()
    sbs = await asyncio.gather(*(one() for _ in range(n)))
    dt = time.monotonic() - t0
    ok = [s for s in sbs if s is not None]
    for s in ok:
        s.sync.stop()
    client.close()
    print("creates_per_s=%.1f ok=%d failed=%d" % (len(ok) / dt, len(ok), n - len(ok)))
    if first_err:
        print("bench sdk.py: first failure: %s" % first_err[0], file=sys.stderr)
    return 0 if len(ok) == n else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
