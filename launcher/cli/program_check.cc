#include "cli/program_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "ddp/common/error.h"
#include "ddp/common/executables.h"

namespace ddp::launcher {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A program that is not a regular file: what to say instead of running it.
std::string not_a_file(const std::string& program, const struct stat& st, bool python) {
  if (S_ISDIR(st.st_mode)) {
    return "program '" + program + "' is a directory" +
           (python ? " without a __main__.py (give the script inside it, or -m for a package)"
                   : ", not a program");
  }
  return "program '" + program + "' is not a regular file";
}

void check_python_program(const LaunchSpec& spec) {
  if (find_on_path(spec.python).empty()) {
    if (!spec.python_source.empty()) {
      throw Error(spec.python_source + "=" + spec.python + ": python interpreter not found (for " +
                  "program '" + spec.program + "'); set " + spec.python_source +
                  " to an interpreter, or pass --no_python");
    }
    throw Error("python interpreter '" + spec.python + "' (for program '" + spec.program +
                "') was not found on PATH; set DDP_PYTHON or pass --no_python");
  }
  if (spec.module) return;
  struct stat st {};
  if (stat(spec.program.c_str(), &st) != 0) {
    throw Error("program '" + spec.program + "': no such file");
  }
  // Python runs a directory holding a __main__.py, as torchrun's python does.
  const std::string main_py = spec.program + "/__main__.py";
  struct stat main_st {};
  const bool runnable_dir =
      S_ISDIR(st.st_mode) && stat(main_py.c_str(), &main_st) == 0 && S_ISREG(main_st.st_mode);
  if (!S_ISREG(st.st_mode) && !runnable_dir) throw Error(not_a_file(spec.program, st, true));
  if (access(spec.program.c_str(), R_OK) != 0) {
    throw Error("program '" + spec.program + "' is not readable");
  }
}

}  // namespace

void check_program(const LaunchSpec& spec) {
  if (spec.runs_under_python()) return check_python_program(spec);
  if (spec.program.find('/') != std::string::npos) {
    struct stat st {};
    if (stat(spec.program.c_str(), &st) != 0)
      throw Error("program '" + spec.program + "': no such file");
    if (!S_ISREG(st.st_mode)) throw Error(not_a_file(spec.program, st, false));
    if (!is_executable_file(spec.program)) {
      throw Error("program '" + spec.program +
                  "' is not executable (no execute permission: chmod +x it, or run it "
                  "through its interpreter)");
    }
    return;
  }
  if (find_on_path(spec.program).empty()) {
    throw Error("program '" + spec.program + "' was not found on PATH");
  }
}

bool is_python_program(const std::string& path) {
  if (ends_with(path, ".py")) return true;
  std::ifstream file(path, std::ios::binary);
  char head[4] = {};
  if (!file.read(head, sizeof(head))) return !file.is_open() ? false : std::string(head, 2) != "#!";
  return !(head[0] == 0x7f && head[1] == 'E' && head[2] == 'L' && head[3] == 'F') &&
         !(head[0] == '#' && head[1] == '!');
}

// The interpreter (DDP_PYTHON, else torchrun's PYTHON_EXEC) and whether the
// program runs under it.
void apply_python(LaunchSpec& spec) {
  for (const char* name : {"DDP_PYTHON", "PYTHON_EXEC"}) {
    if (const char* python = std::getenv(name); python != nullptr && *python != '\0') {
      spec.python = python;
      spec.python_source = name;
      break;
    }
  }
  if (spec.no_python || spec.module) return;
  std::string path = spec.program;
  if (path.find('/') == std::string::npos && !ends_with(path, ".py")) {
    // A bare name: a file here (torchrun runs `train` as python -u train), else a command on PATH.
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) path = find_on_path(path);
  }
  spec.python_program = !path.empty() && is_python_program(path);
}

}  // namespace ddp::launcher
