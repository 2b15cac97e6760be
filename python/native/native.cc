// pscluster._native: the Python client's bulk data path through the C++ PsClient.
//
// grpc-python's receive path costs 2-3.5 ms of CPU per MB (cygrpc copies and slices every
// message in Python objects), 2-3x the C++ client's, which is the step of a small model on a
// few cores. With this module, pscluster.Cluster's dense calls (pull_dense, push_dense,
// push_pull_dense) go through client/ps (the workers' own client: chunked streams, one
// PushPullDenseBatch per shard, replicas and request ids, TLS and tokens) on the numpy
// arrays' own memory, with the GIL released while the shards answer. Everything else stays
// on grpc-python. Both link Debian's libgrpc++ and libprotobuf, so the process holds one copy
// of each. Errors raise _native.Error(code, message): code is the gRPC status code's number.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/ps/ps_client.h"
#include "common/mutex_mode.h"
#include "common/security.h"

namespace py = pybind11;

namespace pscluster {
namespace {

struct StatusError {
  absl::Status status;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}

// A float32 buffer the call reads (or, `writable`, writes) in place: C-contiguous, native
// float32, else TypeError. Holds the buffer (and the array) for the call.
class FloatBuffer {
 public:
  FloatBuffer(const py::buffer& b, bool writable, const char* what) : info_(b.request(writable)) {
    if (info_.itemsize != 4 ||
        (info_.format != "f" && info_.format != "<f" && info_.format != "=f")) {
      throw py::type_error(std::string(what) + ": a float32 buffer is needed, not format '" +
                           info_.format + "'");
    }
    py::ssize_t stride = info_.itemsize;
    for (py::ssize_t d = info_.ndim - 1; d >= 0; --d) {
      if (info_.shape[d] != 1 && info_.strides[d] != stride) {
        throw py::type_error(std::string(what) + ": the buffer must be C-contiguous");
      }
      stride *= info_.shape[d];
    }
  }
  absl::Span<float> span() { return {static_cast<float*>(info_.ptr), size()}; }
  absl::Span<const float> const_span() const {
    return {static_cast<const float*>(info_.ptr), size()};
  }

 private:
  size_t size() const { return static_cast<size_t>(info_.size); }
  py::buffer_info info_;
};

// One PsClient per worker id (the Python client takes the worker per call).
class Client {
 public:
  Client(std::vector<std::vector<std::string>> replicas, double timeout_seconds,
         uint64_t chunk_bytes, bool tls, std::string ca, std::string cert, std::string key,
         std::string token, std::string server_name, std::string client_id) {
    if (replicas.empty()) throw py::value_error("no shards");
    options_.rpc_timeout = absl::Seconds(timeout_seconds);
    options_.client_id = std::move(client_id);  // the Python Cluster's: one for all workers
    options_.chunk_bytes = chunk_bytes;
    bool replicated = false;
    for (const auto& r : replicas) {
      if (r.empty()) throw py::value_error("a shard without an address");
      options_.shard_addresses.push_back(r.front());
      replicated = replicated || r.size() > 1;
    }
    if (replicated) options_.shard_replicas = std::move(replicas);
    options_.security = Security::ForClient(tls, std::move(ca), std::move(cert), std::move(key),
                                            std::move(token), std::move(server_name));
  }

  void PullDense(int32_t worker, uint32_t table, int64_t step, const py::buffer& out) {
    FloatBuffer o(out, /*writable=*/true, "out");
    PsClient* c = For(worker);
    py::gil_scoped_release unlocked;
    Check(c->PullDense(table, step, o.span()));
  }

  void PushDense(int32_t worker, uint32_t table, int64_t step, const py::buffer& grad) {
    FloatBuffer g(grad, /*writable=*/false, "grad");
    PsClient* c = For(worker);
    py::gil_scoped_release unlocked;
    Check(c->PushDense(table, step, g.const_span()));
  }

  void PushPullDense(int32_t worker, int64_t step, const std::vector<uint32_t>& tables,
                     const std::vector<py::buffer>& grads, const std::vector<py::buffer>& outs) {
    if (grads.size() != tables.size() || outs.size() != tables.size()) {
      throw py::value_error("push_pull_dense: one gradient and one output per table");
    }
    std::vector<FloatBuffer> g, o;
    std::vector<absl::Span<const float>> grad_spans;
    std::vector<absl::Span<float>> out_spans;
    g.reserve(tables.size());
    o.reserve(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      g.emplace_back(grads[i], false, "grad");
      o.emplace_back(outs[i], true, "out");
      grad_spans.push_back(g.back().const_span());
      out_spans.push_back(o.back().span());
    }
    PsClient* c = For(worker);
    py::gil_scoped_release unlocked;
    Check(c->PushPullDenseMany(step, tables, grad_spans, out_spans));
  }

 private:
  PsClient* For(int32_t worker) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<PsClient>& c = clients_[worker];
    if (c == nullptr) {
      PsClientOptions o = options_;
      o.worker_id = worker;
      absl::StatusOr<std::unique_ptr<PsClient>> made = PsClient::Create(std::move(o));
      Check(made.status());
      c = *std::move(made);
    }
    return c.get();
  }

  PsClientOptions options_;
  absl::Mutex mu_;
  std::map<int32_t, std::unique_ptr<PsClient>> clients_ ABSL_GUARDED_BY(mu_);
};

}  // namespace
}  // namespace pscluster

PYBIND11_MODULE(_native, m) {
  using pscluster::Client;
  pscluster::NoMutexDeadlockDetection();  // as the daemons (common/mutex_mode.h)
  m.doc() = "The Python client's dense data path through the C++ PsClient (python/native/).";
  static py::exception<pscluster::StatusError> error(m, "Error");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const pscluster::StatusError& e) {
      py::tuple args =
          py::make_tuple(static_cast<int>(e.status.code()), std::string(e.status.message()));
      PyErr_SetObject(error.ptr(), args.ptr());
    }
  });
  py::class_<Client>(m, "Client")
      .def(py::init<std::vector<std::vector<std::string>>, double, uint64_t, bool, std::string,
                    std::string, std::string, std::string, std::string, std::string>(),
           py::arg("replicas"), py::arg("timeout"), py::arg("chunk_bytes"), py::arg("tls"),
           py::arg("ca"), py::arg("cert"), py::arg("key"), py::arg("token"), py::arg("server_name"),
           py::arg("client_id"))
      .def("pull_dense", &Client::PullDense, py::arg("worker"), py::arg("table"), py::arg("step"),
           py::arg("out"))
      .def("push_dense", &Client::PushDense, py::arg("worker"), py::arg("table"), py::arg("step"),
           py::arg("grad"))
      .def("push_pull_dense", &Client::PushPullDense, py::arg("worker"), py::arg("step"),
           py::arg("tables"), py::arg("grads"), py::arg("outs"));
}
