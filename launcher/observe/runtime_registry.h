#pragma once
// The per-user runtime directory through which `ddprun status` without an
// endpoint finds the jobs running on this machine: $XDG_RUNTIME_DIR/ddprun,
// else /tmp/ddprun-<uid> (made 0700; one owned by another user is refused).
// Each ddprun writes one entry (<pid>.job, 0600: it holds the rendezvous
// token) when its rendezvous is known and removes it at exit; entries of
// processes that are gone (a SIGKILLed ddprun) are skipped and removed by
// the next listing.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

struct RuntimeEntry {
  pid_t pid = 0;
  std::string run_id;
  std::string endpoint;  // the rendezvous to ask
  std::string token;
  std::string tls_ca;  // PEM CA for a TLS rendezvous, else empty
};

// The directory (not created); empty when none can be named.
std::string runtime_dir();

// Pure: the entry as text and back (nullopt for a malformed one).
std::string format_entry(const RuntimeEntry& e);
std::optional<RuntimeEntry> parse_entry(const std::string& text);

// Registers this process; removes the entry when destroyed. Failing to
// register is not an error (ddprun status then cannot find the job here).
class RuntimeRegistration {
 public:
  explicit RuntimeRegistration(const RuntimeEntry& entry);
  ~RuntimeRegistration();
  RuntimeRegistration(const RuntimeRegistration&) = delete;
  RuntimeRegistration& operator=(const RuntimeRegistration&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The live entries, oldest process first.
std::vector<RuntimeEntry> list_runtime_entries();

}  // namespace ddp::launcher
