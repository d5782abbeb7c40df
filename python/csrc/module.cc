// ddprun._C: the "ddp" backend's class as torch.distributed sees it.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend.h"
#include "ddp/metrics.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "The c10d backend 'ddp' over libddp (register it with ddprun.torch.register())";
  m.def("step_finished", &ddp::step_finished,
        "Counts a training step on ddprun's progress board (ddprun status STEPS)");
  py::class_<ddprun_torch::DdpBackend, c10d::Backend, c10::intrusive_ptr<ddprun_torch::DdpBackend>>(
      m, "DdpBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::string group_id,
                       std::vector<int64_t> global_ranks) {
             ddprun_torch::BackendSetup setup;
             setup.store = store;
             setup.rank = rank;
             setup.size = size;
             setup.timeout = timeout;
             setup.group_id = std::move(group_id);
             setup.global_ranks = std::move(global_ranks);
             py::gil_scoped_release release;  // the ranks meet through the store
             return c10::make_intrusive<ddprun_torch::DdpBackend>(std::move(setup));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("group_id"), py::arg("global_ranks"))
      .def_property_readonly("cpu_transport", &ddprun_torch::DdpBackend::cpu_transport)
      .def("_time_libddp_all_reduce", &ddprun_torch::DdpBackend::time_libddp_all_reduce,
           py::arg("tensor"), py::arg("iterations"), py::call_guard<py::gil_scoped_release>());
}
