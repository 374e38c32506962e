# Owner(s): ["module: tools"]
"""The series' source-only patch (a change to a C++ file the wheel does not ship), tested
up to the boundary a wheel allows.

"[DTensor] Keep the native sharding cache out of traced regions" changes
torch/csrc/autograd/python_variable.cpp, so it only takes effect in a source build. Here:
- the predicate it adds, compiled from the patch text against this wheel's headers, agrees
  with the Python path's ``_are_we_tracing()`` at every DTensor op dispatch of a compiled
  function and is false in eager: it is called where the C++ fast path would call it, from
  a handler in ``OpDispatcher._custom_op_handlers``, which ``dispatchDTensorOp`` runs
  before its cache lookup;
- the tools treat the patch as source-only: held back, kept out of the overlay repository,
  kept by ``export``, and applied by ``build`` to a checkout's own copy of the file.
"""

import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import _are_we_tracing
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.fake_pg import FakeStore

from tools.base import (
    OverlayError,
    git,
    is_source_only,
    read_pin,
    read_series,
    source_only_series,
    wheel_stopgap,
)
from tools.check import check
from tools.export import export
from tools.overlay_repo import commits, source_only_commits
from tools.sync import sync

REPO = Path(__file__).resolve().parents[2]
SUBJECT = "[DTensor] Keep the native sharding cache out of traced regions"


def the_patch_name(repo: Path = REPO) -> str:
    for name in source_only_series(repo, read_pin(repo)):
        if name.split("-", 1)[1].startswith("DTensor-Keep-the-native-sharding-cache"):
            return name
    raise AssertionError(f"no source-only patch '{SUBJECT}'")


def the_patch() -> bytes:
    return (REPO / "patches" / the_patch_name()).read_bytes()


def added_function(patch: str, signature: str) -> str:
    """The lines a patch adds for one function, from its signature to its closing brace."""
    added = [line[1:] for line in patch.splitlines() if line.startswith("+")]
    start = added.index(signature)
    end = added.index("}", start)
    return "\n".join(added[start : end + 1]) + "\n"


class SourceOnlyPatchTest(TestCase):
    def test_tools_hold_it_back_and_keep_it(self):
        pin = read_pin(REPO)
        source_only = source_only_commits(REPO, pin)
        (commit,) = [c for c in source_only if c.subject == SUBJECT]
        self.assertEqual(commit.files, ("torch/csrc/autograd/python_variable.cpp",))
        self.assertIn("does not ship", commit.needs_build)
        scratch = Path(tempfile.mkdtemp(prefix="source-only-test-"))
        self.addCleanup(shutil.rmtree, scratch)
        project = scratch / "project"
        shutil.copytree(REPO / "patches", project / "patches")
        shutil.copytree(REPO / "test", project / "test")
        before = {p.name: p.read_bytes() for p in (project / "patches").iterdir()}
        sync(project)
        in_overlay = [c.subject for c in commits(project / "torch_overlay")]
        self.assertEqual(len(in_overlay), len(read_series(REPO)) - len(source_only))
        self.assertNotIn(SUBJECT, in_overlay)
        self.assertEqual(export(project), [])  # nothing lost, nothing renamed
        after = {p.name: p.read_bytes() for p in (project / "patches").iterdir()}
        self.assertEqual(after, before)

        # A new overlay patch goes before it; export renumbers it and keeps its text.
        overlay = project / "torch_overlay"
        target = overlay / "torch/distributed/device_mesh.py"
        target.write_text(target.read_text() + "# probe\n")
        git("commit", "-q", "-am", "[DeviceMesh] probe", cwd=overlay)
        olds = source_only_series(project, pin)
        changed = export(project)
        news = source_only_series(project, pin)
        for i, (old, new) in enumerate(zip(olds, news, strict=True)):
            number = f"{len(in_overlay) + 2 + i:04d}"
            self.assertEqual(new.split("-", 1), [number, old.split("-", 1)[1]])
            self.assertIn(f"removed patches/{old}", changed)
            self.assertEqual((project / "patches" / new).read_bytes(), before[old])
        self.assertEqual(read_series(project)[-len(news) :], news)

    def test_check_refuses_a_stopgap_for_a_patch_not_in_the_series(self):
        scratch = Path(tempfile.mkdtemp(prefix="source-only-test-"))
        self.addCleanup(shutil.rmtree, scratch)
        project = scratch / "project"
        shutil.copytree(REPO / "patches", project / "patches")
        shutil.copytree(REPO / "test", project / "test")
        (stopgap,) = [
            p
            for p in (project / "patches").glob("*.patch")
            if wheel_stopgap(p.read_bytes()) == SUBJECT
        ]
        text = stopgap.read_text().replace(f"Wheel-Stopgap: {SUBJECT}", "Wheel-Stopgap: [X] gone")
        stopgap.write_text(text)
        self.assertEqual(
            [p for p in check(project) if "Wheel-Stopgap" in p],
            [
                f"{stopgap.name}: its Wheel-Stopgap names '[X] gone', which is not a patch of the series"
            ],
        )

    def test_a_patch_may_not_mix_wheel_files_and_source_only_files(self):
        pin = read_pin(REPO)
        mixed = the_patch() + (
            b"diff --git a/torch/distributed/device_mesh.py b/torch/distributed/device_mesh.py\n"
        )
        with self.assertRaisesRegex(OverlayError, "split it into two patches"):
            is_source_only(pin, mixed)


class DTensorIsTracingTest(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        from torch.utils.cpp_extension import load_inline

        function = added_function(the_patch().decode(), "static bool dtensor_is_tracing() {")
        source = (
            "#include <torch/extension.h>\n"
            "#include <c10/core/impl/LocalDispatchKeySet.h>\n"
            "#include <c10/core/impl/TorchDispatchModeTLS.h>\n"
            + function
            + "bool is_tracing() { return dtensor_is_tracing(); }\n"
        )
        build_dir = tempfile.mkdtemp(prefix="dtensor-is-tracing-")
        cls.addClassCleanup(shutil.rmtree, build_dir)
        cls.extension = load_inline(
            "dtensor_is_tracing_ext",
            cpp_sources=source,
            functions=["is_tracing"],
            build_directory=build_dir,
            verbose=False,
        )

    def setUp(self):
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        self.mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fsdp", "tp"))

    def tearDown(self):
        dist.destroy_process_group()
        torch._dynamo.reset()
        super().tearDown()

    def test_agrees_with_are_we_tracing_at_every_dispatch(self):
        handlers = DTensor._op_dispatcher._custom_op_handlers
        op = torch.ops.aten.mul.Tensor
        seen = []

        def record_then_dispatch(op_call, args, kwargs):
            # The point where dispatchDTensorOp would evaluate the predicate.
            modes = torch._C._TorchDispatchModeKey
            context = (
                "proxy"
                if torch._C._get_dispatch_mode(modes.PROXY) is not None
                else "fake"
                if torch._C._get_dispatch_mode(modes.FAKE) is not None
                else "eager"
            )
            seen.append((context, self.extension.is_tracing(), _are_we_tracing()))
            del handlers[op]
            try:
                return op_call(*args, **kwargs)
            finally:
                handlers[op] = record_then_dispatch

        def f(w, x):
            tp = w.device_mesh["tp"]
            return DTensor.from_local(w.to_local(), tp, [Replicate()]) * x

        def inputs():
            torch.manual_seed(0)
            w = distribute_tensor(torch.randn(4, 4), self.mesh, [Replicate()] * 2)
            x = distribute_tensor(torch.randn(4, 4), self.mesh["tp"], [Replicate()])
            return w.requires_grad_(), x.requires_grad_()

        handlers[op] = record_then_dispatch
        try:
            f(*inputs())
            torch.compile(f, backend="aot_eager", fullgraph=True)(*inputs())
        except torch._dynamo.exc.BackendCompilerFailed:
            pass  # torch 2.15.0's partitioner refuses this graph, after every trace ran
        finally:
            handlers.pop(op, None)

        self.assertEqual([(c, ours) for c, ours, python in seen if ours != python], [])
        contexts = {(c, ours) for c, ours, _ in seen}
        self.assertIn(("eager", False), contexts)
        self.assertIn(("fake", True), contexts)  # Dynamo's trace, AOTAutograd's metadata pass
        self.assertIn(("proxy", True), contexts)  # make_fx's joint trace


if __name__ == "__main__":
    run_tests()
