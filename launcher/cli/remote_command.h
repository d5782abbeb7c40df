#pragma once
// What the `ddprun --hostfile` front end runs on each host: the shell command
// line ssh hands to the host's login shell (cd to the job's directory, the
// job's environment, the host's ddprun agent), and the ssh argv around it.
// Pure: strings only.

#include <string>
#include <vector>

#include "cli/job_env.h"

namespace ddp::launcher {

// `text` as one word for a POSIX shell ('...', with ' written '\'').
std::string shell_quote(const std::string& text);

// --ssh_opts as a shell would split it (spaces; '...', "..." and \ quote).
// Throws ddp::Error for an unterminated quote.
std::vector<std::string> split_words(const std::string& text, const std::string& flag);

struct RemoteJob {
  std::string workdir;  // cd here first; a clear error (exit 2) when missing there
  EnvList env;
  std::string ddprun;  // the agent's executable (the front end's own path)
  // The agent's argv after the executable: --remote_agent=..., flags, program, its args.
  std::vector<std::string> args;
};

// "cd -- '/w' 2>/dev/null || { printf ... >&2; exit 2; }; exec env 'A=b' '/x/ddprun' ..."
std::string remote_command(const RemoteJob& job);

struct SshSettings {
  int port = 0;                      // 0: ssh's own (its config, else 22)
  std::vector<std::string> options;  // --ssh_opts, split; the user's win over ours
  double timeout_s = 10;             // ConnectTimeout
};

// ssh's argv for running `command` on `host`: no terminal, no password
// prompt (BatchMode), ConnectTimeout, keep-alives that notice a dead link.
std::vector<std::string> ssh_argv(const std::string& host, const SshSettings& ssh,
                                  const std::string& command);

}  // namespace ddp::launcher
