#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "ddp/common/error.h"

namespace train {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'T', 'R', 'A', 'I', 'N'};
constexpr std::uint32_t kVersion = 1;

std::uint64_t fnv1a(const unsigned char* p, std::size_t n,
                    std::uint64_t h = 0xCBF29CE484222325ULL) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ULL;
  }
  return h;
}

std::string errno_text() { return std::strerror(errno); }

// A file descriptor that closes itself.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Accumulates the file in memory (with its checksum) and writes it in one go.
class Encoder {
 public:
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    out_.insert(out_.end(), c, c + n);
  }
  template <typename T>
  void value(T v) {
    bytes(&v, sizeof v);
  }
  void finish() { value(fnv1a(out_.data(), out_.size())); }
  const std::vector<unsigned char>& data() const { return out_; }

 private:
  std::vector<unsigned char> out_;
};

class Decoder {
 public:
  Decoder(const std::vector<unsigned char>& data, const std::string& path)
      : data_(data), path_(path) {}
  void bytes(void* p, std::size_t n) {
    if (n > data_.size() - pos_) throw ddp::Error("checkpoint " + path_ + ": truncated file");
    std::memcpy(p, data_.data() + pos_, n);
    pos_ += n;
  }
  template <typename T>
  T value() {
    T v{};
    bytes(&v, sizeof v);
    return v;
  }
  std::size_t remaining() const { return data_.size() - pos_; }

 private:
  const std::vector<unsigned char>& data_;
  std::string path_;
  std::size_t pos_ = 0;
};

void write_all(int fd, const unsigned char* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw ddp::Error("checkpoint: write " + path + ": " + errno_text());
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::string encode_meta(const CheckpointMeta& meta) {
  std::string text;
  for (const auto& [key, value] : meta) text += key + "=" + value + "\n";
  return text;
}

CheckpointMeta decode_meta(const std::string& text) {
  CheckpointMeta meta;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq != std::string::npos) meta[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return meta;
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointMeta& meta,
                     const std::vector<ddp::ParamBuffer>& buffers) {
  Encoder e;
  e.bytes(kMagic, sizeof kMagic);
  e.value(kVersion);
  const std::string text = encode_meta(meta);
  e.value(static_cast<std::uint64_t>(text.size()));
  e.bytes(text.data(), text.size());
  e.value(static_cast<std::uint64_t>(buffers.size()));
  for (const auto& b : buffers) {
    e.value(static_cast<std::uint32_t>(b.dtype));
    e.value(static_cast<std::uint64_t>(b.count));
    e.bytes(b.data, b.count * ddp::dtype_size(b.dtype));
  }
  e.finish();

  const std::string tmp = path + ".tmp";
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw ddp::Error("checkpoint: open " + tmp + ": " + errno_text());
    write_all(fd.get(), e.data().data(), e.data().size(), tmp);
    if (::fsync(fd.get()) != 0) throw ddp::Error("checkpoint: fsync " + tmp + ": " + errno_text());
    if (::close(fd.release()) != 0)
      throw ddp::Error("checkpoint: close " + tmp + ": " + errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw ddp::Error("checkpoint: rename " + tmp + " to " + path + ": " + errno_text());
  }
  // The rename is durable once the directory entry is.
  auto dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) {
    throw ddp::Error("checkpoint: open directory " + dir.string() + ": " + errno_text());
  }
  if (::fsync(dfd.get()) != 0) {
    throw ddp::Error("checkpoint: fsync directory " + dir.string() + ": " + errno_text());
  }
}

CheckpointMeta load_checkpoint(const std::string& path,
                               const std::vector<ddp::ParamBuffer>& buffers) {
  std::vector<unsigned char> data;
  {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) throw ddp::Error("checkpoint " + path + ": " + errno_text());
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw ddp::Error("checkpoint " + path + ": " + errno_text());
    data.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < data.size()) {
      ssize_t r = ::read(fd.get(), data.data() + got, data.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw ddp::Error("checkpoint " + path + ": read: " + errno_text());
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    data.resize(got);
  }
  if (data.size() < sizeof kMagic + sizeof(std::uint32_t) + sizeof(std::uint64_t) ||
      std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    throw ddp::Error("checkpoint " + path + ": not a train checkpoint (bad magic)");
  }
  const std::size_t body = data.size() - sizeof(std::uint64_t);
  std::uint64_t stored = 0;
  std::memcpy(&stored, data.data() + body, sizeof stored);
  if (fnv1a(data.data(), body) != stored) {
    throw ddp::Error("checkpoint " + path + ": checksum mismatch (corrupt or truncated file)");
  }
  Decoder d(data, path);
  char magic[sizeof kMagic];
  d.bytes(magic, sizeof magic);
  const auto version = d.value<std::uint32_t>();
  if (version != kVersion) {
    throw ddp::Error("checkpoint " + path + ": version " + std::to_string(version) +
                     ", this train reads version " + std::to_string(kVersion));
  }
  const auto meta_bytes = d.value<std::uint64_t>();
  if (meta_bytes > d.remaining()) throw ddp::Error("checkpoint " + path + ": truncated file");
  std::string text(static_cast<std::size_t>(meta_bytes), '\0');
  d.bytes(text.data(), text.size());
  const auto count = d.value<std::uint64_t>();
  if (count != buffers.size()) {
    throw ddp::Error("checkpoint " + path + ": holds " + std::to_string(count) +
                     " buffers, this run has " + std::to_string(buffers.size()) +
                     " (a different model or optimizer)");
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const auto dtype = d.value<std::uint32_t>();
    const auto elements = d.value<std::uint64_t>();
    const auto& b = buffers[i];
    if (dtype != static_cast<std::uint32_t>(b.dtype) || elements != b.count) {
      throw ddp::Error("checkpoint " + path + ": buffer " + std::to_string(i) + " holds " +
                       std::to_string(elements) + " elements of dtype " + std::to_string(dtype) +
                       ", this run expects " + std::to_string(b.count) + " of " +
                       ddp::dtype_name(b.dtype));
    }
    d.bytes(b.data, b.count * ddp::dtype_size(b.dtype));
  }
  if (d.remaining() != sizeof(std::uint64_t)) {
    throw ddp::Error("checkpoint " + path + ": unexpected bytes after the last buffer");
  }
  return decode_meta(text);
}

}  // namespace train
