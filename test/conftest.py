"""This repository's pytest harness for the multi-process tests (not submitted upstream).

Every worker that ``MultiProcessTestCase`` (and so ``DTensorTestBase``) spawns runs its test
through ``_run_worker`` below, and every worker of ``MultiProcContinuousTest`` (and so
``DTensorContinuousTestBase``) runs its test loop through it: it tears the worker's process
groups down for real before the worker's interpreter shuts down.

Why: ``dist.destroy_process_group()`` drops c10d's references, but torch 2.15's
``DeviceMesh._pg_registry`` holds each mesh's ProcessGroup, and DTensor's caches (sharding
propagation, redistribute plans, ...) keep the meshes alive for the life of the process. A
gloo ProcessGroup then outlives the test with its ``pt_gloo_runloop`` threads, and is
destroyed only during interpreter finalization. A runloop thread that releases its last
collective's tensors then (it drops its reference after the waiter has woken) needs the GIL;
taking it while Python finalizes ends the thread with ``pthread_exit``, whose unwinding
through a ``noexcept`` destructor calls ``std::terminate``: "terminate called without an
active exception", SIGABRT, and the test fails on the worker's exit code. Releasing the
meshes' process groups while the interpreter is alive joins those threads first.

A worker that still has gloo threads after this says so on stderr, so a new holder shows
up in the test output instead of as a rare abort.
"""

import gc
import os
import sys
from unittest import mock

import torch.multiprocessing

from torch.testing._internal.common_distributed import (
    MultiProcContinuousTest,
    MultiProcessTestCase,
)


def _gloo_threads():
    try:
        names = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
    except OSError:  # not Linux, or a thread gone meanwhile: nothing to report
        return 0
    return sum(name.startswith("pt_gloo") for name in names)


def _release_process_groups():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    device_mesh = sys.modules.get("torch.distributed.device_mesh")
    mesh_type = getattr(device_mesh, "DeviceMesh", None)
    if isinstance(mesh_type, type):
        for obj in gc.get_objects():
            # The MRO, not isinstance(): DeviceMesh's metaclass has an __instancecheck__
            # that reads obj.__class__, which raises on a dead weakref proxy.
            if mesh_type in type(obj).__mro__:
                registry = obj.__dict__.get("_pg_registry")
                if isinstance(registry, dict):
                    registry.clear()
    gc.collect()
    left = _gloo_threads()
    if left:
        print(
            f"conftest: {left} gloo thread(s) still alive at worker exit (pid {os.getpid()}): "
            "something still holds a destroyed process group",
            file=sys.stderr,
            flush=True,
        )


def _run_worker(run, *args, **kwargs):
    try:
        run(*args, **kwargs)
    finally:  # also after the harness's sys.exit() for a skip or an error
        try:
            _release_process_groups()
        except Exception as e:
            # Never change the worker's exit status; say what happened.
            print(f"conftest: releasing process groups failed: {e!r}", file=sys.stderr)


_start_processes = MultiProcessTestCase._start_processes


def _start_processes_via_run_worker(self, proc):
    def process(*, target, args, **kwargs):
        return proc(target=_run_worker, args=(target, *args), **kwargs)

    return _start_processes(self, process)


MultiProcessTestCase._start_processes = _start_processes_via_run_worker


def _continuous_worker(cls, *args):
    def worker_loop(*args):
        try:
            cls._worker_loop(*args)
        finally:  # MultiProcContinuousTest._init_pg keeps the default group in cls.pg
            cls.pg = None

    _run_worker(worker_loop, *args)


_spawn_continuous = MultiProcContinuousTest._spawn_processes.__func__


@classmethod
def _spawn_continuous_via_run_worker(cls, world_size):
    # _spawn_processes passes the bound cls._worker_loop, which a spawned child unpickles
    # from the test module alone; a target in this module makes the child import it too.
    process = torch.multiprocessing.Process

    def via_run_worker(*, target, args, **kwargs):
        return process(target=_continuous_worker, args=(cls, *args), **kwargs)

    with mock.patch.object(torch.multiprocessing, "Process", via_run_worker):
        _spawn_continuous(cls, world_size)


MultiProcContinuousTest._spawn_processes = _spawn_continuous_via_run_worker
