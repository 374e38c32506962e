// Built by test_clone_obey_contract.py with the patched source tree (here:
// torch_overlay/) first on the include path, so its grad_layout_contract.h (and
// through it accumulate_grad.h's inline AccumulateGrad::accumulateGrad) is
// compiled here instead of the copy inside the installed libtorch. Built a
// second time with CLONE_OBEY_CONTRACT_STOCK_HEADER defined and without that
// include path, it compiles the installed (stock) header: the reference for
// calls that the wheel's AccumulateGrad never makes (e.g. a sparse new_grad).
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/grad_layout_contract.h>
#include <torch/extension.h>

#include <sstream>

namespace {

#ifndef CLONE_OBEY_CONTRACT_STOCK_HEADER
// Compiles only against the patched header: proof of which copy was included.
std::string exact_memory_format(const at::Tensor& variable) {
  const auto format = torch::autograd::utils::exact_memory_format(variable);
  if (!format) {
    return "none";
  }
  std::ostringstream out;
  out << *format;
  return out.str();
}
#endif

at::Tensor clone_obey_contract(
    const at::Tensor& new_grad,
    const at::Tensor& variable) {
  return torch::autograd::utils::clone_obey_contract(new_grad, variable);
}

// First accumulation into an undefined .grad, as the engine's AccumulateGrad
// node does; create_graph is grad mode during backward.
at::Tensor accumulate_grad(
    const at::Tensor& variable,
    const at::Tensor& new_grad,
    bool create_graph) {
  at::AutoGradMode grad_mode(create_graph);
  at::Tensor variable_grad;
  at::Tensor result;
  torch::autograd::AccumulateGrad::accumulateGrad(
      variable,
      variable_grad,
      new_grad,
      /*num_expected_refs=*/1,
      [&](at::Tensor&& grad) { result = std::move(grad); });
  return result;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifndef CLONE_OBEY_CONTRACT_STOCK_HEADER
  m.def("exact_memory_format", &exact_memory_format);
#endif
  m.def("clone_obey_contract", &clone_obey_contract);
  m.def("accumulate_grad", &accumulate_grad);
}
