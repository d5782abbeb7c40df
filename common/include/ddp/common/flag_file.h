#pragma once
// Reading a file that a flag names (a PEM certificate, key or CA; a token file).

#include <string>

namespace ddp {

// The whole file. Throws ddp::Error "FLAG=PATH: cannot read file" when it
// cannot be read.
std::string read_flag_file(const std::string& flag, const std::string& path);

}  // namespace ddp
