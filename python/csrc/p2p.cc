// send and recv. libddp has no point-to-point path, so a message goes
// through the group's store (torch's TCPStore under init_process_group):
// right for the small messages programs exchange this way (pipeline
// schedules, handshakes), slow for large tensors. A send returns once the
// message is stored; a recv waits for it on a thread of its own, so
// matching isend/irecv pairs in any order never deadlock. That thread polls
// (check, not wait): torch's TCPStore client serves one request at a time,
// and a blocking wait would hold this rank's own sends behind it.
#include <c10/util/Exception.h>

#include <cstring>
#include <thread>

#include "backend.h"
#include "ddp/common/error.h"
#include "tensors.h"
#include "work.h"

namespace ddprun_torch {
namespace {

std::string message_key(int from, int to, int tag, uint64_t sequence) {
  return "ddp/p2p/" + std::to_string(from) + "-" + std::to_string(to) + "/" + std::to_string(tag) +
         "/" + std::to_string(sequence);
}

// Waits for `key` in `store` by polling (1 ms, growing to 10 ms), up to `timeout`.
bool poll_for(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  while (!store.check({key})) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
  }
  return true;
}

void check_peer(const char* what, int peer, int rank, int size) {
  TORCH_CHECK_VALUE(peer >= 0 && peer < size && peer != rank, "backend ddp: ", what, ": peer rank ",
                    peer, " is not another rank of a group of ", size);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> DdpBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                int tag) {
  at::Tensor tensor = single("send", tensors);
  check_peer("send", dst, rank_, size_);
  uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    sequence = sent_[{dst, tag}]++;
  }
  at::Tensor bytes = bytes_of(tensor).cpu();
  auto work = c10::make_intrusive<DdpWork>(rank_, c10d::OpType::SEND, "send",
                                           std::vector<at::Tensor>{tensor});
  try {
    store_->set(message_key(rank_, dst, tag, sequence),
                std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
    work->complete(nullptr);
  } catch (...) {
    work->complete(std::current_exception());
  }
  return work;
}

namespace {

// Reads the message under `key` (present) into `tensor` and removes it.
void take_message(c10d::Store& store, const std::string& key, at::Tensor& tensor, int src) {
  const auto stored = store.get(key);
  store.deleteKey(key);
  const auto expected = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  if (stored.size() != expected) {
    throw ddp::Error("backend ddp: recv from rank " + std::to_string(src) + ": the message has " +
                     std::to_string(stored.size()) + " bytes, the tensor " +
                     std::to_string(expected));
  }
  at::Tensor bytes = at::empty({static_cast<int64_t>(stored.size())}, at::kByte);
  std::memcpy(bytes.data_ptr(), stored.data(), stored.size());
  tensor.copy_(bytes.to(tensor.device()).view(tensor.scalar_type()).view(tensor.sizes()));
}

std::string no_message(const std::string& from, std::chrono::milliseconds timeout) {
  return "backend ddp: recv from " + from + ": no message within " +
         std::to_string(timeout.count() / 1000) + " s (the group's timeout)";
}

}  // namespace

c10::intrusive_ptr<c10d::Work> DdpBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                int tag) {
  at::Tensor tensor = single("recv", tensors);
  check_peer("recv", src, rank_, size_);
  uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    sequence = received_[{src, tag}]++;
  }
  auto work = c10::make_intrusive<DdpWork>(rank_, c10d::OpType::RECV, "recv",
                                           std::vector<at::Tensor>{tensor});
  work->set_source_rank(src);
  const std::string key = message_key(src, rank_, tag, sequence);
  std::thread([work, tensor, key, store = setup_.store, timeout = setup_.timeout, src]() mutable {
    try {
      if (!poll_for(*store, key, timeout))
        throw ddp::Error(no_message("rank " + std::to_string(src), timeout));
      take_message(*store, key, tensor, src);
      work->complete(nullptr);
    } catch (...) {
      work->complete(std::current_exception());
    }
  }).detach();
  return work;
}

// From whichever rank's next message with `tag` is stored first: each
// source's next sequence number is claimed only once its message is there.
c10::intrusive_ptr<c10d::Work> DdpBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                         int tag) {
  at::Tensor tensor = single("recv", tensors);
  auto work = c10::make_intrusive<DdpWork>(rank_, c10d::OpType::RECVANYSOURCE, "recv",
                                           std::vector<at::Tensor>{tensor});
  c10::intrusive_ptr<DdpBackend> self =
      c10::intrusive_ptr<DdpBackend>::reclaim_copy(this);  // alive while the thread polls
  std::thread([self, work, tensor, tag]() mutable {
    try {
      const auto deadline = std::chrono::steady_clock::now() + self->setup_.timeout;
      auto pause = std::chrono::microseconds(200);
      while (true) {
        for (int src = 0; src < self->size_; ++src) {
          if (src == self->rank_) continue;
          std::unique_lock<std::mutex> lock(self->p2p_mu_);
          const uint64_t next = self->received_[{src, tag}];
          const std::string key = message_key(src, self->rank_, tag, next);
          if (!self->setup_.store->check({key})) continue;
          self->received_[{src, tag}] = next + 1;
          lock.unlock();
          take_message(*self->setup_.store, key, tensor, src);
          work->set_source_rank(src);
          work->complete(nullptr);
          return;
        }
        if (std::chrono::steady_clock::now() >= deadline)
          throw ddp::Error(no_message("any rank", self->setup_.timeout));
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
      }
    } catch (...) {
      work->complete(std::current_exception());
    }
  }).detach();
  return work;
}

}  // namespace ddprun_torch
