#include "cli/remote_command.h"

#include <cmath>

#include "ddp/common/error.h"

namespace ddp::launcher {

std::string shell_quote(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-+./:=,@%") == std::string::npos) {
    return text;
  }
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::vector<std::string> split_words(const std::string& text, const std::string& flag) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else if (c == '\\' && quote == '"' && i + 1 < text.size()) {
        word += text[++i];
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote != 0) throw Error(flag + "=" + text + ": a quote is not closed");
  if (in_word) words.push_back(word);
  return words;
}

std::string remote_command(const RemoteJob& job) {
  const std::string dir = shell_quote(job.workdir);
  std::string cmd = "cd -- " + dir + " 2>/dev/null || { printf '%s\\n' " +
                    shell_quote("[ddprun] error: the working directory " + job.workdir +
                                " does not exist on this host (ddprun --hostfile runs every "
                                "host in the front end's directory)") +
                    " >&2; exit 2; }; exec env";
  for (const auto& [name, value] : job.env) cmd += " " + shell_quote(name + "=" + value);
  cmd += " " + shell_quote(job.ddprun);
  for (const auto& arg : job.args) cmd += " " + shell_quote(arg);
  return cmd;
}

std::vector<std::string> ssh_argv(const std::string& host, const SshSettings& ssh,
                                  const std::string& command) {
  std::vector<std::string> argv = {"ssh"};
  if (ssh.port > 0) argv.insert(argv.end(), {"-p", std::to_string(ssh.port)});
  argv.insert(argv.end(), ssh.options.begin(), ssh.options.end());
  const int timeout = std::max(1, static_cast<int>(std::ceil(ssh.timeout_s)));
  argv.insert(argv.end(),
              {"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=" + std::to_string(timeout), "-o",
               "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "--", host, command});
  return argv;
}

}  // namespace ddp::launcher
