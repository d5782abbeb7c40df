#pragma once
// The parameter list of GradSync and SharedGradSum (internal): lookups, the
// checks every call taking an index makes, the text naming parameters in
// errors, and prepare()'s broadcast. Errors start with the owner's name.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/grad_averager.h"

namespace ddp::detail {

class ParamList {
 public:
  ParamList(const char* owner, std::vector<GradParam> params);

  const char* owner() const { return owner_; }
  std::size_t size() const { return params_.size(); }
  const std::vector<GradParam>& all() const { return params_; }
  // Unchecked.
  const GradParam& operator[](std::size_t index) const { return params_[index]; }
  // Throws for an index out of range.
  const GradParam& at(std::size_t index) const;
  // Throws when no parameter is called `name`.
  std::size_t index_of(std::string_view name) const;
  // Throws, naming `what` (the call), for an index out of range or a frozen parameter.
  std::size_t checked_trainable(std::size_t index, const char* what) const;
  // Throws unless the (trainable) parameter is float32: grad_view's check.
  void require_float32(std::size_t index) const;
  // "'a' (index 0), 'b' (index 3)": the first 20, then how many more.
  std::string names(const std::vector<std::size_t>& indices) const;
  // Trainable parameters whose flag in `marked` is 0.
  std::vector<std::size_t> unmarked(const std::vector<char>& marked) const;

  // GradAverager::prepare: rank 0's values and buffers everywhere.
  void broadcast_values(ProcessGroup& group, std::size_t chunk_bytes,
                        const std::vector<void*>& param_data,
                        const std::vector<ParamBuffer>& buffers) const;
  // GradAverager::set_needed_gradients's argument checks.
  void check_needed(const std::vector<ElementRange>& per_param) const;

 private:
  const char* owner_;
  std::vector<GradParam> params_;
};

}  // namespace ddp::detail
