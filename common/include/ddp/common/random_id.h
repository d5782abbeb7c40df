#pragma once
#include <string>

namespace ddp {

// `hex_chars` random hexadecimal characters from the kernel's CSPRNG
// (getrandom). Used for run ids and rendezvous tokens.
std::string random_hex(int hex_chars);

}  // namespace ddp
