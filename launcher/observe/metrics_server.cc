#include "observe/metrics_server.h"

#include "ddp/common/error.h"

#ifdef DDP_HAVE_PROMETHEUS
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <mutex>
#include <variant>
#endif

namespace ddp::launcher {

#ifdef DDP_HAVE_PROMETHEUS

namespace {
using Labels = std::map<std::string, std::string>;
using Family =
    std::variant<prometheus::Family<prometheus::Gauge>*, prometheus::Family<prometheus::Counter>*>;
}  // namespace

struct MetricsServer::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  std::map<std::string, Family> families;
  std::map<std::pair<std::string, Labels>, double> counter_values;  // last value set
  std::mutex mu;

  void set(const MetricSample& s) {
    auto it = families.find(s.name);
    if (it == families.end()) return;
    Labels labels(s.labels.begin(), s.labels.end());
    if (auto* gauges = std::get_if<prometheus::Family<prometheus::Gauge>*>(&it->second)) {
      (*gauges)->Add(labels).Set(s.value);
      return;
    }
    auto* counters = std::get<prometheus::Family<prometheus::Counter>*>(it->second);
    double& last = counter_values[{s.name, labels}];
    prometheus::Counter* c = &counters->Add(labels);
    if (s.value < last) {  // a new process counts from zero: so does the series (a reset)
      counters->Remove(c);
      c = &counters->Add(labels);
      last = 0;
    }
    if (s.value > last) c->Increment(s.value - last);
    last = s.value;
  }
};

MetricsServer::MetricsServer(int port, const std::map<std::string, std::string>& constant)
    : impl_(std::make_unique<Impl>()) {
  for (const auto& def : metric_defs()) {
    const std::string help = def.unit.empty() ? def.help : def.help + " (" + def.unit + ")";
    if (def.type == MetricType::kGauge) {
      impl_->families[def.name] =
          &prometheus::BuildGauge().Name(def.name).Help(help).Labels(constant).Register(
              *impl_->registry);
    } else {
      impl_->families[def.name] =
          &prometheus::BuildCounter().Name(def.name).Help(help).Labels(constant).Register(
              *impl_->registry);
    }
  }
  try {
    impl_->exposer = std::make_unique<prometheus::Exposer>("0.0.0.0:" + std::to_string(port), 1);
  } catch (const std::exception& e) {
    throw Error("--metrics_port=" + std::to_string(port) + ": cannot listen on port " +
                std::to_string(port) + " (" + e.what() + "; is it in use?)");
  }
  impl_->exposer->RegisterCollectable(impl_->registry);
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::update(const std::vector<MetricSample>& samples) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& s : samples) impl_->set(s);
}

bool metrics_built_in() { return true; }

#else

struct MetricsServer::Impl {};

MetricsServer::MetricsServer(int port, const std::map<std::string, std::string>&) {
  throw Error("--metrics_port=" + std::to_string(port) +
              ": this ddprun was built without prometheus-cpp (install prometheus-cpp-dev and "
              "rebuild to serve metrics)");
}

MetricsServer::~MetricsServer() = default;
void MetricsServer::update(const std::vector<MetricSample>&) {}
bool metrics_built_in() { return false; }

#endif

}  // namespace ddp::launcher
