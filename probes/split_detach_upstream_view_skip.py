"""Probe: which of test_backward_split_detach.py's cases does upstream main's fix of
the view case (pytorch/pytorch@0f0891af886b: ``stage_backward_input`` skips views
when it detaches its outputs in place) fix on its own?

Applies only that change to the installed ``stage_backward_input`` (a source edit of
one condition, executed in the module) and runs the four tests. Run on stock torch:

    python probes/split_detach_upstream_view_skip.py
"""

import inspect
import os
import sys
import unittest

import torch.distributed.pipelining._backward as backward

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "test/distributed/pipelining"))

OLD = """        for stage_output in stage_outputs_or_loss:
            if isinstance(stage_output, torch.Tensor):
                stage_output.detach_()"""
NEW = """        for stage_output in stage_outputs_or_loss:
            if isinstance(stage_output, torch.Tensor) and not stage_output._is_view():
                stage_output.detach_()"""

source = inspect.getsource(backward)
if source.count(OLD) != 1:
    sys.exit("stage_backward_input's detach loop not found (overlay active?)")
exec(compile(source.replace(OLD, NEW), backward.__file__, "exec"), backward.__dict__)

import test_backward_split_detach  # noqa: E402

unittest.main(module=test_backward_split_detach, argv=[sys.argv[0], "-v"])
