#pragma once
// Finding programs the way execvp does.

#include <string>

namespace ddp {

// A regular file this process may execute.
bool is_executable_file(const std::string& path);

// `name` resolved like execvp would (a name with a '/' as it is, else along
// $PATH); empty when not found.
std::string find_on_path(const std::string& name);

}  // namespace ddp
