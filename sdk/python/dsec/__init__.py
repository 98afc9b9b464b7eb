"""dsec: the Python SDK of the dsec sandbox platform (ctypes over libdsec.so).

    from dsec import DSecClient, FunctionArgs
    with DSecClient() as c:
        sb = c.run_function(FunctionArgs(environment="python:3.11", memory_mb=512,
                                         network={"pypi": True}))
        print(sb.run_shell("python -c 'print(1+1)'").text)
        sb.stop()

See docs/sdk.md.
"""
from .client import (TYPES, AsyncDirWatch, AsyncDSecClient, AsyncProcess, AsyncPty,
                     AsyncSandbox, AsyncShell, CommandFailed, DSecClient, DirWatch, Files,
                     Process, Processes, Pty, Sandbox, Shell)
from .errors import (AlreadyExists, BackendError, CapacityError, Closed, ConnectionFailed,
                     DSecError, Diverged, InvalidArgument, NotFound, NotSupported, Overloaded,
                     QuotaExceeded, StateError, Timeout)
from .types import (ContainerArgs, DirEntry, DirEvent, Transfer, ExecResult, FunctionArgs, MicroVMArgs, ProcessInfo,
                    ProcessOutput, SandboxArgs, SandboxInfo, VMArgs)
from . import _lib
from . import fleet
from . import images
from .images import Images
from .fleet import EventStream, ListedSandbox, SandboxEvent, SandboxList

__version__ = "0.1.0"
library_path = _lib.path

__all__ = [
    "TYPES", "AsyncDirWatch", "AsyncDSecClient", "AsyncProcess", "AsyncPty", "AsyncSandbox",
    "AsyncShell", "CommandFailed",
    "DSecClient", "DirWatch", "Files", "Process", "Processes", "Pty", "Sandbox", "Shell",
    "AlreadyExists", "BackendError", "CapacityError", "Closed", "ConnectionFailed", "DSecError",
    "Diverged", "InvalidArgument", "NotFound", "NotSupported", "Overloaded", "QuotaExceeded", "StateError",
    "Timeout",
    "ContainerArgs", "DirEntry", "DirEvent", "Transfer", "ExecResult", "FunctionArgs", "MicroVMArgs", "SandboxArgs",
    "SandboxInfo", "VMArgs", "library_path",
    "fleet", "images", "Images", "EventStream", "ListedSandbox", "SandboxEvent", "SandboxList",
]
