#include "cli/launch_spec.h"

#include <dirent.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/accelerators.h"
#include "cli/launch_options.h"
#include "cli/program_check.h"
#include "cli/resource_budget.h"
#include "cli/slurm_launch.h"
#include "cli/value_sources.h"
#include "ddp/common/endpoint.h"
#include "ddp/common/error.h"
#include "ddp/common/executables.h"
#include "ddp/common/flag_file.h"
#include "ddp/common/random_id.h"

namespace ddp::launcher {
namespace {

int parse_positive_int(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    throw Error(flag + "=" + text + ": expected a positive integer");
  }
  return std::stoi(text);
}

// Creates `dir` (and parents) and checks that it is writable.
void ensure_writable_dir(const std::string& flag, const std::string& dir) {
  std::string partial;
  std::stringstream parts(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') partial = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      throw Error(flag + "=" + dir + ": cannot create '" + partial + "': " + std::strerror(errno));
    }
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw Error(flag + "=" + dir + ": not a directory");
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error(flag + "=" + dir + ": not writable: " + std::strerror(errno));
  }
}

// Whether the rendezvous uses TLS: node 0 serves with a certificate, the
// others verify with a CA, so either says so on every node.
bool uses_tls(const LaunchSpec& spec) {
  return !spec.tls_cert.empty() || !spec.tls_key.empty() || !spec.tls_ca.empty();
}

// The static form's rendezvous when --rdzv_endpoint is not given: on
// MASTER_ADDR:MASTER_PORT, serving the program's store too (the agent store,
// as torchrun 2.x), or with TLS on MASTER_PORT+1 beside the program's store.
void derive_static_endpoint(LaunchSpec& spec) {
  if (uses_tls(spec)) {
    if (spec.master_port == 0 || spec.master_port >= 65535) {
      throw Error("--master_port=" + std::to_string(spec.master_port) +
                  ": the static form with TLS needs a port below 65535 (the rendezvous listens on "
                  "the next one)");
    }
    spec.rdzv_endpoint = Endpoint{spec.master_addr, spec.master_port + 1}.to_string();
    return;
  }
  if (spec.master_port == 0)
    throw Error("--master_port=0: the static form needs a port the other nodes can find");
  spec.rdzv_endpoint = Endpoint{spec.master_addr, spec.master_port}.to_string();
  spec.agent_store = true;
}

// --rdzv_backend and the static form's endpoint (torchrun's rules, see
// RdzvBackend). Without --rdzv_endpoint the static form's rendezvous is at
// MASTER_ADDR:MASTER_PORT (derive_static_endpoint); so is a Slurm step's
// (`from_slurm`: MASTER_ADDR and MASTER_PORT came from the step), which with
// an elastic --nnodes (the c10d form) listens on MASTER_PORT+1 instead,
// leaving MASTER_PORT to the program's own store.
void apply_backend(LaunchSpec& spec, const std::string& text, const std::string& nnodes_text,
                   bool master_port_given, bool from_slurm) {
  if (text == "etcd" || text == "etcd-v2" || text == "etcd_v2") {
    throw Error("--rdzv_backend=" + text +
                " is not supported: ddprun serves the rendezvous itself; use --rdzv_backend=c10d "
                "with --rdzv_endpoint=HOST:PORT of one of the nodes (or static with --node_rank)");
  }
  if (text == "static") {
    spec.rdzv_backend = RdzvBackend::kStatic;
  } else if (text == "c10d") {
    spec.rdzv_backend = RdzvBackend::kC10d;
  } else if (text.empty()) {
    // Static needs a node rank and a fixed size; anything else is elastic.
    spec.rdzv_backend = spec.node_rank >= 0 && spec.min_nodes == spec.nnodes ? RdzvBackend::kStatic
                                                                             : RdzvBackend::kC10d;
  } else {
    throw Error("--rdzv_backend=" + text + ": expected static or c10d");
  }
  if (!spec.multi_node()) return;
  if (spec.rdzv_backend == RdzvBackend::kStatic) {
    if (spec.node_rank < 0) {
      throw Error("--rdzv_backend=static with --nnodes=" + nnodes_text +
                  " needs --node_rank (0 on the node at --master_addr); or use --rdzv_backend=c10d "
                  "to have ranks assigned");
    }
    if (spec.min_nodes != spec.nnodes) {
      throw Error("--nnodes=" + nnodes_text +
                  " is elastic: use --rdzv_backend=c10d (static needs a fixed size)");
    }
    if (spec.rdzv_endpoint.empty()) {
      if (!master_port_given && !from_slurm) spec.master_port = 29500;  // torchrun's default
      derive_static_endpoint(spec);
    }
    return;
  }
  if (spec.rdzv_endpoint.empty() && from_slurm) {
    spec.rdzv_endpoint = Endpoint{spec.master_addr, spec.master_port + 1}.to_string();
  }
  if (spec.rdzv_endpoint.empty()) {
    throw Error("--rdzv_backend=c10d with --nnodes=" + nnodes_text +
                " needs --rdzv_endpoint HOST[:PORT] (the node that hosts the rendezvous; default "
                "port 29400)");
  }
}

}  // namespace

NodeRange parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  NodeRange nodes;
  try {
    nodes.min = parse_positive_int("--nnodes", text.substr(0, colon));
    nodes.max = colon == std::string::npos ? nodes.min
                                           : parse_positive_int("--nnodes", text.substr(colon + 1));
  } catch (const Error&) {
    throw Error("--nnodes=" + text + ": expected N or MIN:MAX (positive integers)");
  }
  if (nodes.min < 1) throw Error("--nnodes=" + text + ": at least one node is needed");
  if (nodes.min > nodes.max) throw Error("--nnodes=" + text + ": MIN is larger than MAX");
  return nodes;
}

bool LaunchSpec::runs_under_python() const { return !no_python && (module || python_program); }

std::vector<std::string> LaunchSpec::command() const {
  std::vector<std::string> cmd;
  if (runs_under_python()) {
    // -u like torchrun: unbuffered output reaches the rank-prefixed stream at once.
    cmd = {python, "-u"};
    if (module) cmd.push_back("-m");
  }
  cmd.push_back(program);
  cmd.insert(cmd.end(), program_args.begin(), program_args.end());
  return cmd;
}

int count_usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int resolve_nproc(const std::string& text, int visible_gpus, int usable_cpus, int visible_xpus) {
  if (text == "auto")
    return visible_gpus > 0 ? visible_gpus : visible_xpus > 0 ? visible_xpus : usable_cpus;
  if (text == "cpu") return usable_cpus;
  if (text == "gpu") {
    if (visible_gpus == 0) {
      throw Error(
          "--nproc_per_node=gpu: no GPU is visible to this process (no NVIDIA or ROCm device, "
          "or CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES hides them)");
    }
    return visible_gpus;
  }
  if (text == "xpu") {
    if (visible_xpus == 0)
      throw Error("--nproc_per_node=xpu: no Intel XPU is visible to this process");
    return visible_xpus;
  }
  if (text == "0") throw Error("--nproc_per_node=0: at least one worker is needed");
  if (text.empty() || text.size() > 6 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    throw Error("--nproc_per_node=" + text +
                ": expected a positive integer, auto, cpu, gpu or xpu");
  }
  return std::stoi(text);
}

namespace {

// `--local_ranks_filter`: torchrun shows the listed ranks this node has and
// ignores the others (the same list serves nodes of different sizes).
std::vector<int> parse_rank_filter(const std::string& text, int nproc) {
  if (text.find_first_not_of(',') == std::string::npos) {
    throw Error("--local_ranks_filter is empty: give a comma-separated list of local ranks");
  }
  std::vector<int> ranks;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty() || item.size() > 9 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      throw Error("--local_ranks_filter=" + text + ": '" + item + "' is not a local rank");
    }
    if (int rank = std::stoi(item); rank < nproc) ranks.push_back(rank);
  }
  return ranks;
}

// After CLI11 could not convert a value: "--NAME=VALUE: expected ..." for
// the first number option whose value is not one (the caller's ValueSources
// then names where it came from), or nullopt.
std::optional<std::string> unconvertible_value(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    const bool whole = type == "INT" || type == "UINT";
    if ((!whole && type != "FLOAT") || option->get_lnames().empty()) continue;
    for (const std::string& value : option->results()) {
      std::size_t used = 0;
      bool ok = !value.empty();
      try {
        if (ok && whole) (void)std::stoll(value, &used);
        if (ok && !whole) (void)std::stod(value, &used);
      } catch (const std::exception&) {
        ok = false;
      }
      if (!ok || used != value.size() || (type == "UINT" && value.front() == '-')) {
        return "--" + option->get_lnames().front() + "=" + value + ": expected " +
               (whole ? std::string(type == "UINT" ? "a whole number >= 0" : "a whole number")
                      : std::string("a number"));
      }
    }
  }
  return std::nullopt;
}

// CLI11's parse of the launcher's arguments (abbreviations resolved).
// Returns the outcome for --help, --version and --print_completion, else
// nullopt.
std::optional<ParseOutcome> parse_into(CLI::App& app, std::vector<std::string> args,
                                       LaunchText& text) {
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    return ParseOutcome{std::nullopt, app.help(), 0};
  } catch (const CLI::CallForVersion&) {
    return ParseOutcome{std::nullopt, "ddprun 0.1.0\n", 0};
  } catch (const CLI::FileError& e) {
    throw Error(std::string("--config: ") + e.what());
  } catch (const CLI::ConfigError& e) {
    throw Error(std::string("--config: ") + e.what());
  } catch (const CLI::ConversionError& e) {
    if (auto named = unconvertible_value(app)) throw Error(*named);
    throw Error(e.what());
  } catch (const CLI::ParseError& e) {
    // CLI11 reports a bad value from the file under the option's name only.
    CLI::Option* config = app.get_config_ptr();
    if (config != nullptr && config->count() > 0) {
      throw Error(std::string(e.what()) + " (on the command line or in --config " +
                  config->as<std::string>() + ")");
    }
    throw Error(e.what());
  }
  if (!text.print_completion.empty())
    return ParseOutcome{std::nullopt, completion_script(app, text.print_completion), 0};
  return std::nullopt;
}

// Everything CLI11 did not take: [--] PROGRAM ARGS... The first item must
// not look like a launcher option: an unknown option is an error, not the
// program's name.
void take_program(LaunchSpec& spec, std::vector<std::string> rest) {
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
    throw Error("unknown option '" + rest.front() +
                "' (launcher options go before the program; use -- to end them)");
  }
  if (rest.empty()) throw Error("no program given: usage: ddprun [OPTIONS] PROGRAM [ARGS...]");
  spec.program = rest.front();
  spec.program_args.assign(rest.begin() + 1, rest.end());
}

void apply_nnodes(LaunchSpec& spec, const std::string& nnodes_text) {
  const NodeRange nodes = parse_nnodes(nnodes_text);
  spec.min_nodes = nodes.min;
  spec.nnodes = nodes.max;
  if (!spec.multi_node() && spec.node_rank == -1) spec.node_rank = 0;
  if (spec.node_rank < -1 || spec.node_rank >= spec.nnodes) {
    throw Error("--node_rank=" + std::to_string(spec.node_rank) +
                " must be in [0, --nnodes=" + std::to_string(spec.nnodes) + ")");
  }
  if (spec.standalone && spec.multi_node()) {
    throw Error("--standalone runs a single node; it cannot be combined with --nnodes=" +
                nnodes_text);
  }
}

void apply_endpoint(LaunchSpec& spec) {
  if (spec.rdzv_endpoint.empty()) {
    spec.rdzv_host = "127.0.0.1";
    spec.rdzv_port = 0;
    return;
  }
  Endpoint ep = parse_endpoint(spec.rdzv_endpoint, 29400, "--rdzv_endpoint");
  spec.rdzv_host = ep.host;
  spec.rdzv_port = ep.port;
  if (ep.port == 0 && spec.multi_node()) {
    throw Error("--rdzv_endpoint=" + spec.rdzv_endpoint +
                ": port 0 cannot be found by the other nodes; give a port (default 29400)");
  }
}

void apply_token_and_tls(LaunchSpec& spec, const std::string& token_file) {
  if (!token_file.empty()) {
    if (!spec.rdzv_token.empty())
      throw Error("--rdzv_token_file and --rdzv_token (or DDP_RDZV_TOKEN) are both given");
    const std::string text = read_flag_file("--rdzv_token_file", token_file);
    spec.rdzv_token = text.substr(0, text.find('\n'));
    while (!spec.rdzv_token.empty() &&
           std::isspace(static_cast<unsigned char>(spec.rdzv_token.back()))) {
      spec.rdzv_token.pop_back();
    }
    if (spec.rdzv_token.empty())
      throw Error("--rdzv_token_file=" + token_file + ": the first line is empty");
  }
  if (spec.rdzv_token.empty() && !spec.multi_node()) spec.rdzv_token = random_hex(32);
  if (spec.tls_cert.empty() != spec.tls_key.empty()) {
    throw Error("--rdzv_tls_cert and --rdzv_tls_key must be given together");
  }
  for (const auto& [flag, path] :
       {std::pair<std::string, std::string>{"--rdzv_tls_cert", spec.tls_cert},
        {"--rdzv_tls_key", spec.tls_key},
        {"--rdzv_tls_ca", spec.tls_ca}}) {
    if (!path.empty() && access(path.c_str(), R_OK) != 0)
      throw Error(flag + "=" + path + ": cannot read file");
  }
}

// TORCH_ELASTIC_SHUTDOWN_TIMEOUT: torchrun's grace when --shutdown_timeout
// (or its PET_ variable, or the config file) does not give one.
void apply_shutdown_default(LaunchSpec& spec, bool given) {
  const char* text = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  if (given || text == nullptr || *text == '\0') return;
  try {
    size_t used = 0;
    spec.shutdown_timeout_s = std::stod(text, &used);
    if (used != std::strlen(text)) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    throw Error(std::string("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=") + text +
                " is not a number of seconds");
  }
  if (!(spec.shutdown_timeout_s >= 0 && spec.shutdown_timeout_s <= 86400)) {
    throw Error(std::string("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=") + text +
                " must be in [0, 86400] seconds");
  }
}

void check_ranges(const LaunchSpec& spec) {
  if (spec.master_addr.empty()) throw Error("--master_addr is empty");
  if (spec.max_restarts < 0)
    throw Error("--max_restarts=" + std::to_string(spec.max_restarts) + " must be >= 0");
  if (!(spec.monitor_interval_s > 0 && spec.monitor_interval_s <= 3600)) {
    throw Error("--monitor_interval must be in (0, 3600] seconds");
  }
  if (!(spec.hang_timeout_s == 0 ||
        (spec.hang_timeout_s >= 0.5 && spec.hang_timeout_s <= 86400 * 7))) {
    throw Error("--hang_timeout must be 0 (off) or in [0.5, 604800] seconds");
  }
  if (!(spec.shutdown_timeout_s >= 0 && spec.shutdown_timeout_s <= 86400)) {
    throw Error("--shutdown_timeout must be in [0, 86400] seconds");
  }
  if (spec.metrics_port < 0 || spec.metrics_port > 65535) {
    throw Error("--metrics_port=" + std::to_string(spec.metrics_port) +
                " must be 0 (off) or a TCP port (1-65535)");
  }
  if (!(spec.status_interval_s == 0 ||
        (spec.status_interval_s >= 0.05 && spec.status_interval_s <= 3600))) {
    throw Error("--status_interval must be 0 (off) or in [0.05, 3600] seconds");
  }
  if (!(spec.straggler_window_s == 0 ||
        (spec.straggler_window_s >= 2 && spec.straggler_window_s <= 86400))) {
    throw Error("--straggler_window must be 0 (off) or in [2, 86400] seconds");
  }
  if (spec.straggler_window_s > 0 && spec.status_interval_s > 0 &&
      spec.straggler_window_s < 4 * spec.status_interval_s) {
    throw Error("--straggler_window must be 0 (off) or at least 4 samples (4 x --status_interval)");
  }
  if (spec.module && spec.no_python) throw Error("-m/--module and --no_python cannot be combined");
}

OnFailure parse_on_failure(const std::string& text) {
  if (text == "restart") return OnFailure::kRestart;
  if (text == "heal") return OnFailure::kHeal;
  throw Error("--on_failure=" + text + ": expected restart or heal");
}

void apply_log_dir(LaunchSpec& spec) {
  if ((spec.redirects.any() || spec.tee.any()) && spec.log_dir.empty()) {
    // Like torchrun: redirected streams need files, so they go to a temp dir (announced).
    const char* tmp = std::getenv("TMPDIR");
    spec.log_dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun-logs";
    spec.log_dir_defaulted = true;
  }
  if (!spec.log_dir.empty()) ensure_writable_dir("--log_dir", spec.log_dir);
}

}  // namespace

// Everything after the parse: the values checked and combined into `spec`.
void complete_spec(CLI::App& app, LaunchSpec& spec, LaunchText& text) {
  // torchrun's PET_RDZV_ID names the run as PET_RUN_ID does.
  if (text.run_id.empty()) {
    if (const char* id = std::getenv("PET_RDZV_ID"); id != nullptr) text.run_id = id;
  }
  SlurmTook slurm;
  {
    GivenShape given;
    given.nnodes = app.count("--nnodes") > 0;
    given.node_rank = app.count("--node_rank") > 0;
    given.endpoint = app.count("--rdzv_endpoint") > 0;
    given.master_addr = app.count("--master_addr") > 0;
    given.master_port = app.count("--master_port") > 0;
    given.run_id = !text.run_id.empty();
    given.standalone = spec.standalone;
    slurm = apply_slurm_step(spec, text.nnodes, text.run_id, given);
  }
  spec.nproc_per_node = resolve_nproc(spec.nproc_per_node_text,
                                      spec.cuda_visible_devices.empty()
                                          ? count_gpus()
                                          : count_visible_list(spec.cuda_visible_devices),
                                      count_usable_cpus(), count_xpus());
  apply_nnodes(spec, text.nnodes);
  if (spec.master_port < 0 || spec.master_port > 65535) {
    throw Error("--master_port=" + std::to_string(spec.master_port) +
                " is not a TCP port (0-65535)");
  }
  const bool master_port_given = spec.master_port != 0 || app.count("--master_port") > 0;
  const TorchrunShape shape{.backend = text.rdzv_backend,
                            .standalone = spec.standalone,
                            .endpoint_given = !spec.rdzv_endpoint.empty(),
                            .master_port_given = master_port_given,
                            .node_rank_given = spec.node_rank >= 0,
                            .min_nodes = spec.min_nodes,
                            .max_nodes = spec.nnodes};
  spec.rdzv_conf = parse_rdzv_conf(text.rdzv_conf, torch_handler(shape), &spec.notices);
  apply_backend(spec, text.rdzv_backend, text.nnodes, master_port_given, slurm.rendezvous);
  if (slurm.any()) spec.notices.insert(spec.notices.begin(), slurm.line(spec));
  apply_endpoint(spec);
  apply_token_and_tls(spec, text.token_file);
  apply_shutdown_default(spec, app.count("--shutdown_timeout") > 0);
  check_ranges(spec);
  spec.on_failure = parse_on_failure(text.on_failure);
  spec.redirects = parse_stream_map("--redirects", text.redirects);
  spec.tee = parse_stream_map("--tee", text.tee);
  if (!text.local_ranks_filter.empty()) {
    spec.local_ranks_filter = parse_rank_filter(text.local_ranks_filter, spec.nproc_per_node);
  }
  spec.rank_prefix = !text.no_prefix;
  // torchrun's default id is "none", so the same command works on every node;
  // a single node's id only has to be unique (it names shm segments and logs).
  if (text.run_id.empty()) text.run_id = spec.multi_node() ? "none" : random_hex(12);
  if (text.run_id.find('/') != std::string::npos || text.run_id == "." || text.run_id == "..") {
    throw Error("--run_id=" + text.run_id + ": must not contain '/' or be '.' or '..'");
  }
  spec.run_id = text.run_id;
  apply_python(spec);
  apply_log_dir(spec);
  if (const char* v = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); v != nullptr) {
    text.line_prefix_template_variable = v;
  }
  for (auto& notice : torchrun_only_notices(text)) spec.notices.push_back(std::move(notice));
}

// Where each option's value came from (the command line, a variable, a line
// of the --config file, read strictly here: a bad line or an unknown key is
// refused before CLI11 would take or skip it).
ValueSources value_sources(const CLI::App& app, const std::vector<std::string>& args,
                           const std::vector<KnownOption>& known) {
  const std::map<std::string, std::string> given = options_given(args, known);
  const auto config_given = given.find("config");
  const std::string config = config_given == given.end() ? "" : config_given->second;
  std::vector<ConfigEntry> entries;
  if (!config.empty()) {
    std::ifstream file(config);
    if (file) {  // a missing file is CLI11's to name
      std::stringstream text;
      text << file.rdbuf();
      entries = read_config_entries(text.str(), config, known);
    }
  }
  std::map<std::string, std::string> envnames;
  for (const CLI::Option* option : app.get_options()) {
    if (!option->get_envname().empty() && !option->get_lnames().empty()) {
      envnames["--" + option->get_lnames().front()] = option->get_envname();
    }
  }
  return ValueSources(given, known, envnames, entries, config,
                      [](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

ParseOutcome parse_launch_args(const std::vector<std::string>& argv, bool check_program_exists) {
  CLI::App app{
      "ddprun: a torchrun-compatible launcher and supervisor for data-parallel training.\n"
      "Usage: ddprun [OPTIONS] PROGRAM [ARGS...]   (everything after PROGRAM is passed to it)",
      "ddprun"};
  app.prefix_command();
  // A flag given twice takes its last value, like torchrun's argparse.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_config("--config", "",
                 "TOML job file; the command line wins over it, and it wins over PET_* variables");
  app.allow_config_extras(false);
  app.set_version_flag("--version", "ddprun 0.1.0");

  LaunchSpec spec;
  LaunchText text;
  declare_launch_options(app, spec, text);
  std::vector<std::string> args(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  const std::vector<KnownOption> known = known_options(app);
  args = expand_option_prefixes(args, known);
  const ValueSources sources = value_sources(app, args, known);
  try {
    if (auto early = parse_into(app, args, text)) return *early;
    take_program(spec, app.remaining());
    complete_spec(app, spec, text);
  } catch (const Error& e) {
    throw Error(sources.relabel(e.what()));
  }
  if (check_program_exists) {
    check_program(spec);
    ensure_resources(spec.nproc_per_node, !spec.log_dir.empty());
  }
  return {spec, "", 0};
}

}  // namespace ddp::launcher
