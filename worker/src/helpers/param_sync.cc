#include "ddp/params.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>

#include "ddp/common/error.h"
#include "ddp/work.h"
#include "helpers/helpers_internal.h"

namespace ddp {

// ----------------------------------------------------------- check_same_params

namespace {

bool valid_dtype(DType dtype) {
  int d = static_cast<int>(dtype);
  return d >= static_cast<int>(DType::kFloat32) && d <= static_cast<int>(DType::kUInt8);
}

std::string dtype_text(DType dtype) {
  return valid_dtype(dtype) ? dtype_name(dtype)
                            : "dtype#" + std::to_string(static_cast<int>(dtype));
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string encode_params(const std::vector<ParamInfo>& params) {
  detail::Encoder e;
  e.i64(static_cast<std::int64_t>(params.size()));
  for (const auto& p : params) {
    e.str(p.name);
    e.i64(static_cast<std::int64_t>(p.dtype));
    e.i64(static_cast<std::int64_t>(p.shape.size()));
    for (auto d : p.shape) e.i64(d);
  }
  return e.bytes();
}

std::vector<ParamInfo> decode_params(const std::string& bytes) {
  detail::Decoder d(bytes, "check_same_params");
  std::int64_t n = d.i64();
  std::vector<ParamInfo> params;
  for (std::int64_t i = 0; i < n; ++i) {
    ParamInfo p;
    p.name = d.str();
    p.dtype = static_cast<DType>(d.i64());
    std::int64_t dims = d.i64();
    for (std::int64_t k = 0; k < dims; ++k) p.shape.push_back(d.i64());
    params.push_back(std::move(p));
  }
  return params;
}

std::string first_entry_difference(const std::vector<ParamInfo>& reference, int reference_rank,
                                   const std::vector<ParamInfo>& other, int other_rank) {
  std::string ref = "rank " + std::to_string(reference_rank);
  std::string oth = "rank " + std::to_string(other_rank);
  std::size_t n = std::min(reference.size(), other.size());
  for (std::size_t i = 0; i < n; ++i) {
    const ParamInfo& a = reference[i];
    const ParamInfo& b = other[i];
    std::string at = "parameter " + std::to_string(i);
    if (a.name != b.name)
      return at + ": " + oth + " has name '" + b.name + "', " + ref + " has '" + a.name + "'";
    at += " '" + a.name + "'";
    if (a.shape != b.shape) {
      return at + ": " + oth + " has shape " + shape_text(b.shape) + ", " + ref + " has " +
             shape_text(a.shape);
    }
    if (a.dtype != b.dtype) {
      return at + ": " + oth + " has dtype " + dtype_text(b.dtype) + ", " + ref + " has " +
             dtype_text(a.dtype);
    }
  }
  return "";
}

}  // namespace

std::string describe_param_difference(const std::vector<ParamInfo>& reference, int reference_rank,
                                      const std::vector<ParamInfo>& other, int other_rank) {
  std::string first = first_entry_difference(reference, reference_rank, other, other_rank);
  if (reference.size() == other.size()) return first;
  auto count = [](std::size_t n) {
    return std::to_string(n) + (n == 1 ? " parameter" : " parameters");
  };
  std::string text = "rank " + std::to_string(other_rank) + " has " + count(other.size()) +
                     ", rank " + std::to_string(reference_rank) + " has " +
                     std::to_string(reference.size());
  if (!first.empty()) return text + "; first difference: " + first;
  // The shorter list is a prefix of the longer: name the first extra one.
  bool other_longer = other.size() > reference.size();
  const auto& longer = other_longer ? other : reference;
  std::size_t k = std::min(reference.size(), other.size());
  return text + "; first extra: parameter " + std::to_string(k) + " '" + longer[k].name +
         "' on rank " + std::to_string(other_longer ? other_rank : reference_rank);
}

void check_same_params(const std::vector<ParamInfo>& params, ProcessGroup& group) {
  if (group.size() == 1) return;
  auto all = detail::gather_if_different(group, encode_params(params));
  if (!all) return;
  std::vector<std::vector<ParamInfo>> lists;
  for (const auto& bytes : *all) lists.push_back(decode_params(bytes));
  const int ref = detail::majority_rank(*all);
  std::string first;
  std::vector<int> differ;
  for (int r = 0; r < group.size(); ++r) {
    if (r == ref) continue;
    std::string diff = describe_param_difference(lists[ref], ref, lists[r], r);
    if (diff.empty()) continue;
    if (first.empty()) first = diff;
    differ.push_back(r);
  }
  if (first.empty()) return;  // the descriptions differed only in bytes that decode the same
  std::string text = "check_same_params: " + first;
  if (differ.size() > 1) {
    text +=
        "; ranks differing from rank " + std::to_string(ref) + ": " + detail::join_ranks(differ);
  }
  throw Error(text);
}

void check_same_params(const std::vector<ParamInfo>& params) {
  if (ProcessGroup* group = detail::helper_group("check_same_params"))
    check_same_params(params, *group);
}

// ------------------------------------------------ broadcast_params, sync_buffers

namespace {

// One collective: a slice of one buffer reduced or broadcast in place, or
// several whole small buffers packed into a staging buffer.
struct Piece {
  std::size_t buffer;
  std::size_t offset;  // elements
  std::size_t count;   // elements
};
struct Transfer {
  bool reduce = false;  // all_reduce kAvg, else broadcast from root
  DType dtype = DType::kUInt8;
  bool packed = false;
  std::size_t bytes = 0;
  std::vector<Piece> pieces;
};

// Groups buffers into transfers of at most `chunk_bytes` (see SyncOptions).
std::vector<Transfer> plan_transfers(const std::vector<ParamBuffer>& buffers,
                                     const std::vector<bool>& reduce, std::size_t chunk_bytes,
                                     bool allow_packing) {
  std::vector<Transfer> plan;
  Transfer pack;
  auto flush = [&] {
    if (pack.pieces.empty()) return;
    if (pack.pieces.size() == 1) {  // alone: no need to copy it
      const ParamBuffer& b = buffers[pack.pieces[0].buffer];
      pack.packed = false;
      pack.dtype = b.dtype;
    }
    plan.push_back(std::move(pack));
    pack = Transfer{};
  };
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const ParamBuffer& b = buffers[i];
    if (b.count == 0) continue;
    std::size_t element = dtype_size(b.dtype);
    std::size_t bytes = b.count * element;
    // Broadcasts move bytes, so any dtypes pack together; reductions need one dtype.
    DType pack_dtype = reduce[i] ? b.dtype : DType::kUInt8;
    if (!allow_packing || bytes > chunk_bytes) {
      flush();
      std::size_t slice = std::max<std::size_t>(1, chunk_bytes / element);
      for (std::size_t offset = 0; offset < b.count; offset += slice) {
        Transfer t;
        t.reduce = reduce[i];
        t.dtype = b.dtype;
        t.pieces.push_back({i, offset, std::min(slice, b.count - offset)});
        t.bytes = t.pieces[0].count * element;
        plan.push_back(std::move(t));
      }
      continue;
    }
    if (!pack.pieces.empty() && (pack.reduce != reduce[i] || pack.dtype != pack_dtype ||
                                 pack.bytes + bytes > chunk_bytes)) {
      flush();
    }
    pack.reduce = reduce[i];
    pack.dtype = pack_dtype;
    pack.packed = true;
    pack.pieces.push_back({i, 0, b.count});
    pack.bytes += bytes;
  }
  flush();
  return plan;
}

char* piece_address(const std::vector<ParamBuffer>& buffers, const Piece& p) {
  const ParamBuffer& b = buffers[p.buffer];
  return static_cast<char*>(b.data) + p.offset * dtype_size(b.dtype);
}

void copy_pieces(const std::vector<ParamBuffer>& buffers, const Transfer& t, char* staging,
                 bool into_staging) {
  std::size_t at = 0;
  for (const Piece& p : t.pieces) {
    std::size_t bytes = p.count * dtype_size(buffers[p.buffer].dtype);
    char* address = piece_address(buffers, p);
    if (into_staging) {
      std::memcpy(staging + at, address, bytes);
    } else {
      std::memcpy(address, staging + at, bytes);
    }
    at += bytes;
  }
}

// Runs the plan: every transfer issued asynchronously in order, at most two
// staging buffers live. Every issued collective is waited for before this
// returns or throws (the executor may still write into staging memory).
void run_transfers(ProcessGroup& group, const std::vector<ParamBuffer>& buffers,
                   const std::vector<Transfer>& plan, int root) {
  struct Pending {
    std::shared_ptr<Work> work;
    std::shared_ptr<void> staging;
    const Transfer* transfer;
  };
  constexpr int kMaxStaged = 2;
  std::deque<Pending> pending;
  int staged = 0;
  std::exception_ptr error;
  const bool is_root = group.rank() == root;

  auto finish_oldest = [&] {
    Pending p = std::move(pending.front());
    pending.pop_front();
    if (p.staging) --staged;
    try {
      p.work->wait();
      if (!error && p.staging && (p.transfer->reduce || !is_root)) {
        copy_pieces(buffers, *p.transfer, static_cast<char*>(p.staging.get()), false);
      }
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  };

  for (const Transfer& t : plan) {
    if (error) break;  // the group is broken; stop issuing
    try {
      std::shared_ptr<void> staging;
      void* data;
      std::size_t count;
      if (t.packed) {
        while (staged >= kMaxStaged) finish_oldest();
        if (error) break;
        staging = group.allocate(t.bytes);
        if (t.reduce || is_root) copy_pieces(buffers, t, static_cast<char*>(staging.get()), true);
        data = staging.get();
        count = t.bytes / dtype_size(t.dtype);
      } else {
        data = piece_address(buffers, t.pieces[0]);
        count = t.pieces[0].count;
      }
      auto work = t.reduce ? group.all_reduce_async(data, count, t.dtype, ReduceOp::kAvg)
                           : group.broadcast_async(data, count, t.dtype, root);
      if (staging) ++staged;
      pending.push_back({std::move(work), std::move(staging), &t});
    } catch (...) {
      error = std::current_exception();
    }
  }
  while (!pending.empty()) finish_oldest();
  if (error) std::rethrow_exception(error);
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

// What a rank passes, for the all-ranks argument check: its own problem (or
// ""), root, and the count and dtype of each buffer.
std::string encode_layout(const std::vector<ParamBuffer>& buffers, int root,
                          const std::string& problem) {
  detail::Encoder e;
  e.str(problem);
  e.i64(root);
  e.i64(static_cast<std::int64_t>(buffers.size()));
  for (const auto& b : buffers) {
    e.i64(static_cast<std::int64_t>(b.count));
    e.i64(static_cast<std::int64_t>(b.dtype));
  }
  return e.bytes();
}

struct Layout {
  std::string problem;
  std::int64_t root = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> buffers;  // count, dtype
};

Layout decode_layout(const std::string& bytes, const char* what) {
  detail::Decoder d(bytes, what);
  Layout l;
  l.problem = d.str();
  l.root = d.i64();
  std::int64_t n = d.i64();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t count = d.i64();
    l.buffers.emplace_back(count, d.i64());
  }
  return l;
}

// This rank's own argument problem, or "".
std::string local_problem(const std::vector<ParamBuffer>& buffers, const SyncOptions& options,
                          int size) {
  if (options.chunk_bytes == 0) return "chunk_bytes must be > 0";
  if (options.root < 0 || options.root >= size) {
    return "root " + std::to_string(options.root) + " is outside [0, " + std::to_string(size) + ")";
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (!valid_dtype(buffers[i].dtype)) {
      return "buffer " + std::to_string(i) + " has an unknown dtype (" +
             std::to_string(static_cast<int>(buffers[i].dtype)) + ")";
    }
    if (buffers[i].data == nullptr && buffers[i].count > 0) {
      return "buffer " + std::to_string(i) + " has no data (nullptr) for " +
             std::to_string(buffers[i].count) + " elements";
    }
  }
  return "";
}

// Every rank learns whether every rank passed usable, matching arguments;
// if not, every rank throws the same error naming the rank at fault.
void check_layout(ProcessGroup& group, const std::vector<ParamBuffer>& buffers,
                  const SyncOptions& options, const char* what) {
  std::string problem = local_problem(buffers, options, group.size());
  if (group.size() == 1) {
    if (!problem.empty()) throw Error(std::string(what) + ": " + problem);
    return;
  }
  auto all = detail::gather_if_different(group, encode_layout(buffers, options.root, problem));
  if (!all) {
    if (!problem.empty()) throw Error(std::string(what) + ": every rank: " + problem);
    return;
  }
  std::vector<Layout> layouts;
  for (const auto& bytes : *all) layouts.push_back(decode_layout(bytes, what));
  for (int r = 0; r < group.size(); ++r) {
    if (!layouts[r].problem.empty())
      throw Error(std::string(what) + ": rank " + std::to_string(r) + ": " + layouts[r].problem);
  }
  // Every rank must name the same root; then every rank's buffers are compared with root's.
  for (int r = 1; r < group.size(); ++r) {
    if (layouts[r].root != layouts[0].root) {
      throw Error(std::string(what) + ": rank " + std::to_string(r) + " passes root " +
                  std::to_string(layouts[r].root) + ", rank 0 passes root " +
                  std::to_string(layouts[0].root));
    }
  }
  const int ref = static_cast<int>(layouts[0].root);
  const auto& reference = layouts[ref].buffers;
  std::string ref_name = "rank " + std::to_string(ref);
  for (int r = 0; r < group.size(); ++r) {
    const auto& mine = layouts[r].buffers;
    if (mine == reference) continue;
    std::string name = "rank " + std::to_string(r);
    std::string text =
        std::string(what) + ": " + name + "'s buffers differ from " + ref_name + "'s: ";
    std::size_t n = std::min(mine.size(), reference.size());
    std::size_t i = 0;
    while (i < n && mine[i] == reference[i]) ++i;
    auto show = [](const std::pair<std::int64_t, std::int64_t>& b) {
      return std::to_string(b.first) + " " + dtype_text(static_cast<DType>(b.second));
    };
    if (i < n) {
      text += "buffer " + std::to_string(i) + ": " + name + " has " + show(mine[i]) + ", " +
              ref_name + " has " + show(reference[i]);
    } else {
      text += name + " passes " + std::to_string(mine.size()) + " buffers, " + ref_name +
              " passes " + std::to_string(reference.size());
    }
    throw Error(text + " (check_same_params names the parameter)");
  }
}

void sync(const std::vector<ParamBuffer>& buffers, SyncMode mode, ProcessGroup& group,
          const SyncOptions& options, const char* what) {
  check_layout(group, buffers, options, what);
  if (group.size() == 1) return;
  std::vector<bool> reduce(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i)
    reduce[i] = mode == SyncMode::kAverage && is_floating(buffers[i].dtype);
  // Device memory (nccl) cannot be packed with memcpy: it goes in place, in slices.
  bool allow_packing = group.backend_name() != "nccl";
  run_transfers(group, buffers, plan_transfers(buffers, reduce, options.chunk_bytes, allow_packing),
                options.root);
}

}  // namespace

void broadcast_params(const std::vector<ParamBuffer>& params, ProcessGroup& group,
                      const SyncOptions& options) {
  sync(params, SyncMode::kBroadcast, group, options, "broadcast_params");
}

void broadcast_params(const std::vector<ParamBuffer>& params, const SyncOptions& options) {
  if (ProcessGroup* group = detail::helper_group("broadcast_params")) {
    broadcast_params(params, *group, options);
  } else {
    if (auto problem = local_problem(params, options, 1); !problem.empty())
      throw Error("broadcast_params: " + problem);
  }
}

void sync_buffers(const std::vector<ParamBuffer>& buffers, SyncMode mode, ProcessGroup& group,
                  const SyncOptions& options) {
  sync(buffers, mode, group, options, "sync_buffers");
}

void sync_buffers(const std::vector<ParamBuffer>& buffers, SyncMode mode,
                  const SyncOptions& options) {
  if (ProcessGroup* group = detail::helper_group("sync_buffers")) {
    sync_buffers(buffers, mode, *group, options);
  } else {
    if (auto problem = local_problem(buffers, options, 1); !problem.empty())
      throw Error("sync_buffers: " + problem);
  }
}

}  // namespace ddp
