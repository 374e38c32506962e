// Built by test_clone_obey_contract.py with the patched source tree (here:
// torch_overlay/) first on the include path, so its grad_layout_contract.h (and
// through it accumulate_grad.h's inline AccumulateGrad::accumulateGrad) is
// compiled here instead of the copy inside the installed libtorch.
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/grad_layout_contract.h>
#include <torch/extension.h>

#include <sstream>

namespace {

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
  m.def("exact_memory_format", &exact_memory_format);
  m.def("clone_obey_contract", &clone_obey_contract);
  m.def("accumulate_grad", &accumulate_grad);
}
