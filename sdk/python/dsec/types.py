"""Argument and result dataclasses. Switching a rollout between a function
call, a container, a microVM and a VM is a change of one parameter: the
arguments are the same dataclass shape for each, and the type is chosen by
the run_* method (or run(type=...))."""
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Union


@dataclass
class SandboxArgs:
    """What to create.

    environment: environment name:version (for container/microvm/vm, the image).
    memory_mb / cpu (cores, e.g. 0.5) / disk_mb: resources; 0 or None: the cell default.
    max_lifetime_s / idle_timeout_s: 0 or None: the cell default.
    network: rules such as {"pypi": True, "npm": False}; names mapped to True are
        allowed (mirrors, domains or address ranges); everything else is denied.
        Sent as the create's net entries (docs/network.md); on a node with
        network containment every sandbox type enforces them (function calls
        run in the sandbox's network namespace; see ContainerArgs).
    user: the user commands run as (applied to every exec of the sandbox unless
        the exec names another).
    labels: key/value labels put on the sandbox.
    rollout_id: the rollout the sandbox serves; exec/files.write with a step are
        recorded in its trajectory log and fast-forwarded when re-issued.
    requires: capability names (own_kernel, nested_containers, gui, ...).
    """
    environment: Optional[str] = None
    memory_mb: Optional[int] = None
    cpu: Optional[float] = None
    disk_mb: Optional[int] = None
    max_lifetime_s: Optional[int] = None
    idle_timeout_s: Optional[int] = None
    network: Mapping[str, bool] = field(default_factory=dict)
    user: Optional[str] = None
    labels: Mapping[str, str] = field(default_factory=dict)
    rollout_id: Optional[str] = None
    requires: List[str] = field(default_factory=list)
    affinity: Mapping[str, str] = field(default_factory=dict)
    cell: Optional[str] = None
    cls: Optional[str] = None          # rollout (default) | job | batch
    priority: int = 0
    pausable: bool = False
    request_id: Optional[str] = None   # idempotency key; None: a fresh one per call
    project: Optional[str] = None      # the tenant's project it counts against ("rl/math")


@dataclass
class FunctionArgs(SandboxArgs):
    """A function call sandbox (the lightest type)."""


@dataclass
class ContainerArgs(SandboxArgs):
    """A container: an OCI container (crun) whose root filesystem is an overlay
    of its environment's layers, with dsec-agent as init.

    environment: an environment of the cell's layer registry, "name:version"
        (e.g. "busybox:1", "python:3", or a name published by
        Sandbox.snapshot); required. An unknown name fails the create with
        NotFound naming it.
    cpu / memory_mb: the container's cgroup limits (CPU quota, memory limit:
        a process past it is OOM-killed, the container lives on).
    max_lifetime_s / idle_timeout_s: the node destroys the container when
        either runs out.
    network: sent as the create's net entries (the names mapped to True,
        e.g. {"pypi": True, "npm": False} -> ["pypi"]): mirror names from the
        cell configuration, domains ("*.example.com:443/tcp") and address
        ranges. On a node with network containment (the cell's net: section)
        the container reaches only what they allow, through its node's
        resolver; Sandbox.set_network changes them while it runs. On a node
        without it the container has only loopback, and a create with rules
        fails with NotSupported.
    labels, rollout_id, user: as for every type (SandboxArgs).
    """

    @property
    def image(self):
        return self.environment


@dataclass
class MicroVMArgs(SandboxArgs):
    """A microVM: QEMU's microvm machine booting the node's guest kernel, its
    root an overlay (inside the guest) of the environment's layers as
    read-only EROFS disks and a writable disk of its own, dsec-agent as the
    guest's init. Same environments, policies, files and exec as a
    container; fork clones the running machine (memory included), each child
    with a fresh hostname, machine id and random seed.

    environment: as for ContainerArgs; optional here (none: a busybox root).
    memory_mb: guest memory (at least 128; the node's default when 0).
    disk_mb: size of the writable disk.
    """


@dataclass
class VMArgs(SandboxArgs):
    """A full VM: QEMU's q35 machine (PCI devices) with the same kernel,
    disks and agent as a microVM, for work that needs a whole machine."""


@dataclass
class SandboxInfo:
    id: str
    node: str
    type: str
    state: str
    cell: str
    existing: bool = False


@dataclass
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int = 0
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_us: int = 0
    cpu_us: int = 0       # 0 when the backend does not measure it
    peak_rss_kb: int = 0  # 0 when the backend does not measure it
    interrupted: bool = False    # a shell session's command that Shell.interrupt ended
    session_ended: bool = False  # a shell session's command after which the session is gone

    @property
    def ok(self):
        return (self.exit_code == 0 and self.signal == 0 and not self.timed_out
                and not self.interrupted)

    @property
    def text(self):
        return self.stdout.decode(errors="replace")


@dataclass
class DirEntry:
    name: str
    kind: str   # file | dir | link | other
    size: int
    mode: int
    mtime: int


@dataclass
class DirEvent:
    """A change Files.watch saw."""
    event: str  # create, modify, delete, moved_from, moved_to, attrib, overflow, gone
    path: str   # absolute, in the sandbox
    dir: bool


@dataclass
class Transfer:
    """What an upload published or a download received, checked at both ends."""
    size: int
    sha256: str        # lowercase hex
    upload_id: str = ""  # an upload's: give it back with resume=True after a failure
    resumed_from: int = 0  # bytes the sandbox held already (not sent again)


Data = Union[bytes, bytearray, memoryview, str]
Labels = Dict[str, str]


@dataclass
class ProcessInfo:
    """A background process as its sandbox keeps it (Sandbox.processes)."""
    handle: int
    pid: int
    running: bool
    cmdline: str
    exit_code: int = 0      # when not running; -1 when a signal ended it
    signal: int = 0         # when not running: the signal that ended it
    timed_out: bool = False
    stdin_open: bool = False
    started_ns: int = 0
    ended_ns: int = 0       # 0 while running
    stdout_total: int = 0   # bytes it wrote to stdout in all
    stderr_total: int = 0
    pty: bool = False       # it runs on a terminal (Sandbox.pty)
    session: bool = False   # it is a shell session (Sandbox.shell)
    busy: bool = False      # a shell session running a command now


@dataclass
class ProcessOutput:
    """A window of a background process's output (Process.read)."""
    info: ProcessInfo
    stdout: bytes
    stderr: bytes
    stdout_from: int  # the stream offset of stdout[0]
    stderr_from: int
