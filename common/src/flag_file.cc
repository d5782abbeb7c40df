#include "ddp/common/flag_file.h"

#include <fstream>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp {

std::string read_flag_file(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(flag + "=" + path + ": cannot read file");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace ddp
