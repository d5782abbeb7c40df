#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "ddp/common/error.h"

namespace train {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'T', 'R', 'A', 'I', 'N'};
constexpr std::uint32_t kVersion = 1;

std::uint64_t fnv1a(const unsigned char* p, std::size_t n) {
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ULL;
  return h;
}

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw ddp::Error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

// fsync()s `path` (a file or a directory).
void sync_path(const std::string& path, int flags, const char* what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail(std::string("open") + what, path);
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) fail(std::string("fsync") + what, path);
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointMeta& meta,
                     const std::vector<ddp::ParamBuffer>& buffers) {
  std::vector<unsigned char> out;
  const auto bytes = [&out](const void* p, std::size_t n) {
    out.insert(out.end(), static_cast<const unsigned char*>(p),
               static_cast<const unsigned char*>(p) + n);
  };
  const auto u64 = [&bytes](std::uint64_t v) { bytes(&v, sizeof v); };
  std::string text;
  for (const auto& [key, value] : meta) text += key + "=" + value + "\n";
  bytes(kMagic, sizeof kMagic);
  bytes(&kVersion, sizeof kVersion);
  u64(text.size());
  bytes(text.data(), text.size());
  u64(buffers.size());
  for (const auto& b : buffers) {
    const auto dtype = static_cast<std::uint32_t>(b.dtype);
    bytes(&dtype, sizeof dtype);
    u64(b.count);
    bytes(b.data, b.count * ddp::dtype_size(b.dtype));
  }
  u64(fnv1a(out.data(), out.size()));

  // PATH.tmp, written and fsync'ed, renamed over PATH; then the directory
  // entry is made durable.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    if (!file) fail("open", tmp);
    file.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    file.close();
    if (!file) fail("write", tmp);
  }
  sync_path(tmp, O_RDONLY, "");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename " + tmp + " to", path);
  auto dir = std::filesystem::path(path).parent_path();
  sync_path(dir.empty() ? "." : dir.string(), O_RDONLY | O_DIRECTORY, " directory");
}

namespace {

CheckpointMeta parse_meta(const std::string& text) {
  CheckpointMeta meta;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (const auto eq = line.find('='); eq != std::string::npos)
      meta[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return meta;
}

// Reads and checks `path`; fills `buffers` unless it is null.
CheckpointMeta read_checkpoint(const std::string& path,
                               const std::vector<ddp::ParamBuffer>* buffers_or_null) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw ddp::Error("checkpoint " + path + ": " + std::strerror(errno));
  const std::vector<unsigned char> data((std::istreambuf_iterator<char>(file)),
                                        std::istreambuf_iterator<char>());
  const auto error = [&path](const std::string& what) {
    return ddp::Error("checkpoint " + path + ": " + what);
  };
  if (data.size() < sizeof kMagic + sizeof(std::uint32_t) + sizeof(std::uint64_t) ||
      std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    throw error("not a train checkpoint (bad magic)");
  }
  const std::size_t body = data.size() - sizeof(std::uint64_t);
  std::uint64_t stored = 0;
  std::memcpy(&stored, data.data() + body, sizeof stored);
  if (fnv1a(data.data(), body) != stored)
    throw error("checksum mismatch (corrupt or truncated file)");

  std::size_t pos = sizeof kMagic;
  const auto read = [&](void* p, std::size_t n) {
    if (n > body - pos) throw error("truncated file");
    std::memcpy(p, data.data() + pos, n);
    pos += n;
  };
  const auto u64 = [&read] {
    std::uint64_t v = 0;
    read(&v, sizeof v);
    return v;
  };
  std::uint32_t version = 0;
  read(&version, sizeof version);
  if (version != kVersion) {
    throw error("version " + std::to_string(version) + ", this train reads version " +
                std::to_string(kVersion));
  }
  const std::uint64_t meta_bytes = u64();
  if (meta_bytes > body - pos) throw error("truncated file");
  std::string text(static_cast<std::size_t>(meta_bytes), '\0');
  read(text.data(), text.size());
  if (buffers_or_null == nullptr) return parse_meta(text);
  const auto& buffers = *buffers_or_null;
  const std::uint64_t count = u64();
  if (count != buffers.size()) {
    throw error("holds " + std::to_string(count) + " buffers, this run has " +
                std::to_string(buffers.size()) + " (a different model or optimizer)");
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    std::uint32_t dtype = 0;
    read(&dtype, sizeof dtype);
    const std::uint64_t elements = u64();
    const auto& b = buffers[i];
    if (dtype != static_cast<std::uint32_t>(b.dtype) || elements != b.count) {
      throw error("buffer " + std::to_string(i) + " holds " + std::to_string(elements) +
                  " elements of dtype " + std::to_string(dtype) + ", this run expects " +
                  std::to_string(b.count) + " of " + ddp::dtype_name(b.dtype));
    }
    read(b.data, b.count * ddp::dtype_size(b.dtype));
  }
  if (pos != body) throw error("unexpected bytes after the last buffer");
  return parse_meta(text);
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path,
                               const std::vector<ddp::ParamBuffer>& buffers) {
  return read_checkpoint(path, &buffers);
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  return read_checkpoint(path, nullptr);
}

}  // namespace train
