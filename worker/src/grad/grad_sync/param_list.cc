#include "grad/grad_sync/param_list.h"

#include <algorithm>

#include "ddp/common/error.h"

namespace ddp {

std::size_t GradParam::count() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
  return n;
}

namespace detail {

ParamList::ParamList(const char* owner, std::vector<GradParam> params)
    : owner_(owner), params_(std::move(params)) {}

const GradParam& ParamList::at(std::size_t index) const {
  if (index >= params_.size()) {
    throw Error(std::string(owner_) + ": parameter index " + std::to_string(index) +
                " is out of range (" + std::to_string(params_.size()) + " parameters)");
  }
  return params_[index];
}

std::size_t ParamList::index_of(std::string_view name) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return i;
  }
  throw Error(std::string(owner_) + ": no parameter is called '" + std::string(name) + "'");
}

std::size_t ParamList::checked_trainable(std::size_t index, const char* what) const {
  if (index >= params_.size()) {
    throw Error(std::string(owner_) + ": " + what + ": parameter index " + std::to_string(index) +
                " is out of range (" + std::to_string(params_.size()) + " parameters)");
  }
  if (!params_[index].requires_grad) {
    throw Error(std::string(owner_) + ": " + what + ": parameter '" + params_[index].name +
                "' (index " + std::to_string(index) +
                ") is frozen (requires_grad = false): it has no gradient");
  }
  return index;
}

void ParamList::require_float32(std::size_t index) const {
  if (params_[index].dtype != DType::kFloat32) {
    throw Error(std::string(owner_) + ": grad_view: parameter '" + params_[index].name + "' is " +
                dtype_name(params_[index].dtype) + ", not float32 (use grad())");
  }
}

std::string ParamList::names(const std::vector<std::size_t>& indices) const {
  constexpr std::size_t kShown = 20;
  std::string text;
  for (std::size_t k = 0; k < indices.size() && k < kShown; ++k) {
    text += (k ? ", '" : "'") + params_[indices[k]].name + "' (index " +
            std::to_string(indices[k]) + ")";
  }
  if (indices.size() > kShown) text += " and " + std::to_string(indices.size() - kShown) + " more";
  return text;
}

std::vector<std::size_t> ParamList::unmarked(const std::vector<char>& marked) const {
  std::vector<std::size_t> out;
  for (std::size_t p = 0; p < params_.size(); ++p) {
    if (params_[p].requires_grad && !marked[p]) out.push_back(p);
  }
  return out;
}

void ParamList::broadcast_values(ProcessGroup& group, std::size_t chunk_bytes,
                                 const std::vector<void*>& param_data,
                                 const std::vector<ParamBuffer>& buffers) const {
  if (param_data.size() != params_.size()) {
    throw Error(std::string(owner_) + ": prepare: " + std::to_string(param_data.size()) +
                " parameter pointers for " + std::to_string(params_.size()) + " parameters");
  }
  std::vector<ParamBuffer> all;
  all.reserve(params_.size() + buffers.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    all.push_back({param_data[i], params_[i].count(), params_[i].dtype});
  all.insert(all.end(), buffers.begin(), buffers.end());
  SyncOptions sync;
  sync.root = 0;
  sync.chunk_bytes = chunk_bytes;
  broadcast_params(all, group, sync);
}

void ParamList::check_needed(const std::vector<ElementRange>& per_param) const {
  const std::string where = std::string(owner_) + "::set_needed_gradients: ";
  if (!per_param.empty() && per_param.size() != params_.size()) {
    throw Error(where + std::to_string(per_param.size()) + " ranges for " +
                std::to_string(params_.size()) + " parameters");
  }
  for (std::size_t p = 0; p < per_param.size(); ++p) {
    const ElementRange& r = per_param[p];
    if (r.begin > r.end || r.end > params_[p].count()) {
      throw Error(where + "elements [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                  ") are not within parameter '" + params_[p].name + "' (" +
                  std::to_string(params_[p].count()) + " elements)");
    }
  }
}

}  // namespace detail
}  // namespace ddp
