#include "ddp/common/random_id.h"

#include <sys/random.h>

#include <vector>

#include "ddp/common/error.h"

namespace ddp {

std::string random_hex(int hex_chars) {
  std::vector<unsigned char> bytes((hex_chars + 1) / 2);
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("getrandom failed while generating an id");
    }
    got += static_cast<size_t>(n);
  }
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  out.resize(hex_chars);
  return out;
}

}  // namespace ddp
