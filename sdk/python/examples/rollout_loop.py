"""A trainer's rollout loop: 100 concurrent rollouts against a local cell.

    dsec up --port 4222 &          # or: make demo's cell, any cell
    PYTHONPATH=sdk/python python3 sdk/python/examples/rollout_loop.py [--url URL] [--type sim]
    ... --type container --env busybox:1    # a cell with a container node (docs/sdk.md)

Each rollout creates a sandbox (all creates in flight at once from one event
loop), runs its steps through the trajectory log (rollout id + step number,
so a restarted trainer re-issuing them fast-forwards), reads its result back
and stops the sandbox. Switching the sandbox type is the --type parameter.
"""
import argparse
import asyncio
import time
import uuid

import dsec


async def rollout(client, i, type_, env, run_id, steps):
    rid = "%s-r%03d" % (run_id, i)
    args = dsec.SandboxArgs(environment=env, cpu=0.05, memory_mb=64,
                            max_lifetime_s=600, idle_timeout_s=120, network={"pypi": True},
                            labels={"rollout": str(i)}, rollout_id=rid)
    async with await client.run(type_, args) as sb:
        for step in range(1, steps + 1):
            # an action: the agent's command, logged as this rollout's step
            r = await sb.exec(["echo", "rollout %d step %d" % (i, step)], step=2 * step - 1)
            await sb.files.write("/work/trace.txt", r.stdout, append=True, step=2 * step)
        return len((await sb.files.read("/work/trace.txt")).splitlines())


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None, help="default: $DSEC_URL or nats://127.0.0.1:4222")
    ap.add_argument("--type", default="sim", help="function | container | microvm | vm | sim")
    ap.add_argument("--env", default="python:3.11",
                    help="environment name:version (containers: one of the cell's layer registry)")
    ap.add_argument("--rollouts", type=int, default=100)
    ap.add_argument("--steps", type=int, default=3)
    o = ap.parse_args()
    run_id = "train-" + uuid.uuid4().hex[:8]
    t0 = time.monotonic()
    async with dsec.AsyncDSecClient(url=o.url) as client:
        results = await asyncio.gather(
            *(rollout(client, i, o.type, o.env, run_id, o.steps) for i in range(o.rollouts)),
            return_exceptions=True)
    dt = time.monotonic() - t0
    ok = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    print("%d rollouts of %d steps on %s in %.2f s: %d ok, %d failed"
          % (o.rollouts, o.steps, o.type, dt, len(ok), len(failed)))
    for e in failed[:5]:
        print("  failed: %s (retry_safe=%s)" % (e, getattr(e, "retry_safe", None)))
    return 0 if not failed and all(n == o.steps for n in ok) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
