#include "cli/hostfile_args.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <sstream>

#include "cli/launch_options.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

// The option `token` names (long or short), or nullptr.
const KnownOption* find_option(const std::vector<KnownOption>& known, const std::string& token) {
  const bool is_long = token.rfind("--", 0) == 0;
  const std::string name = is_long ? token.substr(0, token.find('=')) : token.substr(0, 2);
  for (const auto& option : known) {
    if (!is_long && option.has_short_name && option.short_name == name) return &option;
    if (is_long && std::find(option.long_names.begin(), option.long_names.end(), name) !=
                       option.long_names.end()) {
      return &option;
    }
  }
  return nullptr;
}

bool has_inline_value(const std::string& token) {
  return token.rfind("--", 0) == 0 ? token.find('=') != std::string::npos : token.size() > 2;
}

// Flags the front end takes out of what the agents get (it passes its own).
bool kept_by_front_end(const std::string& canonical) {
  const auto& own = hostfile_flag_names();
  return std::find(own.begin(), own.end(), canonical) != own.end() || canonical == "--rdzv_conf" ||
         canonical == "--run_id" || canonical == "--nproc_per_node" || canonical == "--nnodes";
}

// Splits the (expanded) arguments into the forwarded flags and the program.
void split_tokens(const std::vector<std::string>& args, const std::vector<KnownOption>& known,
                  FrontEndArgs& out) {
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& token = args[i];
    if (token == "--" || token.empty() || token[0] != '-' || token == "-") break;
    const KnownOption* option = find_option(known, token);
    const size_t count =
        option != nullptr && option->takes_value && !has_inline_value(token) && i + 1 < args.size()
            ? 2
            : 1;
    const std::string canonical = option != nullptr && !option->long_names.empty()
                                      ? option->long_names.front()
                                      : token.substr(0, token.find('='));
    if (!kept_by_front_end(canonical)) {
      out.forwarded.insert(out.forwarded.end(), args.begin() + static_cast<long>(i),
                           args.begin() + static_cast<long>(i + count));
    }
    i += count - 1;
  }
  if (i < args.size() && args[i] == "--") ++i;
  out.program.assign(args.begin() + static_cast<long>(i), args.end());
  if (out.program.empty())
    throw Error("no program given: usage: ddprun --hostfile FILE [OPTIONS] PROGRAM [ARGS...]");
}

// Whether any argument could name a front-end flag (or a --config file that
// may): a cheap look that spares a local launch the second parse (~0.3 ms).
bool may_name_front_end_flags(const std::vector<std::string>& argv) {
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("-H", 0) == 0) return true;
    if (arg.rfind("--", 0) != 0 || arg.size() < 3) continue;
    std::string name = arg.substr(0, arg.find('='));
    std::replace(name.begin() + 2, name.end(), '-', '_');
    for (const auto& flag : hostfile_flag_names())
      if (flag.rfind(name, 0) == 0) return true;
    if (std::string("--config").rfind(name, 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::optional<FrontEndArgs> parse_front_end_args(const std::vector<std::string>& argv) {
  if (!may_name_front_end_flags(argv)) return std::nullopt;
  CLI::App app{"ddprun", "ddprun"};
  app.prefix_command();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_config("--config", "", "TOML job file");
  app.set_version_flag("--version", "ddprun");
  LaunchSpec spec;
  LaunchText text;
  declare_launch_options(app, spec, text);
  const auto known = known_options(app);
  std::vector<std::string> args(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  try {
    args = expand_option_prefixes(args, known);
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError&) {
    return std::nullopt;  // help, version, or an error the launcher's parser reports
  } catch (const Error&) {
    return std::nullopt;
  }
  const HostfileText& hosts = text.hosts;
  if (hosts.hostfile.empty() && hosts.hosts.empty()) {
    for (const auto& name : hostfile_flag_names()) {
      if (app.count(name) > 0) throw Error(name + " needs --hostfile or --hosts");
    }
    return std::nullopt;
  }
  if (!hosts.hostfile.empty() && !hosts.hosts.empty())
    throw Error("--hostfile and --hosts cannot be combined: give the hosts one way");
  for (const auto& name : flags_set_by_front_end()) {
    if (app.count(name) > 0) {
      throw Error(name + " cannot be combined with " +
                  (hosts.hostfile.empty() ? "--hosts" : "--hostfile") +
                  ": the front end starts one agent per host and sets it for each");
    }
  }
  if (!(hosts.ssh_timeout_s > 0 && hosts.ssh_timeout_s <= 3600))
    throw Error("--ssh_timeout must be in (0, 3600] seconds");
  if (hosts.ssh_port < 0 || hosts.ssh_port > 65535)
    throw Error("--ssh_port=" + std::to_string(hosts.ssh_port) + " is not a TCP port");
  FrontEndArgs out;
  out.text = hosts;
  out.rdzv_conf = without_is_host(text.rdzv_conf);
  out.run_id = text.run_id;
  if (app.count("--nproc_per_node") > 0) out.nproc = spec.nproc_per_node_text;
  if (app.count("--nnodes") > 0) {
    parse_nnodes(text.nnodes);  // malformed: refused here, before any host is read
    out.nnodes = text.nnodes;
  }
  out.shutdown_timeout_s = spec.shutdown_timeout_s;
  split_tokens(args, known, out);
  return out;
}

NodeRange hostfile_node_range(const std::string& nnodes, size_t hosts, const std::string& source) {
  const int n = static_cast<int>(hosts);
  if (nnodes.empty()) return {n, n};
  const NodeRange range = parse_nnodes(nnodes);
  if (range.max != n) {
    throw Error("--nnodes=" + nnodes + " does not fit the " + std::to_string(n) + " host(s) of " +
                source + ": with --hostfile or --hosts it is " + std::to_string(n) +
                ", or MIN:" + std::to_string(n) + " for a job that goes on while MIN hosts remain");
  }
  return range;
}

std::string host_address(const std::string& ssh_name) {
  const auto at = ssh_name.find('@');
  return at == std::string::npos ? ssh_name : ssh_name.substr(at + 1);
}

std::string without_is_host(const std::string& rdzv_conf) {
  std::string kept;
  std::stringstream items(rdzv_conf);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty() || item.rfind("is_host", 0) == 0) continue;
    kept += (kept.empty() ? "" : ",") + item;
  }
  return kept;
}

std::vector<std::string> agent_args(const FrontEndArgs& args, const std::vector<HostSlots>& hosts,
                                    size_t index, const std::string& run_id,
                                    double gate_timeout_s) {
  const HostSlots& host = hosts.at(index);
  std::ostringstream gate;
  gate << gate_timeout_s;
  std::vector<std::string> argv = {
      "--remote_agent=" + gate.str(),
      "--nnodes=" + (args.nnodes.empty() ? std::to_string(hosts.size()) : args.nnodes),
      "--nproc_per_node=" + (args.nproc.empty() ? std::to_string(host.workers()) : args.nproc),
      "--rdzv_backend=c10d",
      "--rdzv_endpoint=" + Endpoint{host_address(hosts.front().name), 29400}.to_string(),
      "--rdzv_id=" + run_id,
      "--rdzv_conf=" + args.rdzv_conf + (args.rdzv_conf.empty() ? "" : ",") +
          "is_host=" + (index == 0 ? "1" : "0")};
  argv.insert(argv.end(), args.forwarded.begin(), args.forwarded.end());
  argv.push_back("--");
  argv.insert(argv.end(), args.program.begin(), args.program.end());
  return argv;
}

}  // namespace ddp::launcher
